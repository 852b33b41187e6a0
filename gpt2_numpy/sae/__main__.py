"""`python -m gpt2_numpy.sae` runs the sae command (gpt2_numpy/commands/sae.py)."""
from gpt2_numpy.commands.sae import main

main()
