"""`python -m gpt2_numpy.sae` runs the sae command (gpt2_numpy/commands/sae.py). Loaded by name, as
gpt2_numpy/commands/__init__.py loads each command: the library below does not import the command lines above it."""
import importlib

importlib.import_module("gpt2_numpy.commands.sae").main()
