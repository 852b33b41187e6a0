"""`python -m gpt2_numpy COMMAND ...` is `gpt2-numpy COMMAND ...` (gpt2_numpy/commands/__init__.py); a first argument
that names no command is a prompt, as in `python -m gpt2_numpy "Alan Turing theorized that"`."""
from gpt2_numpy.commands import main

main()
