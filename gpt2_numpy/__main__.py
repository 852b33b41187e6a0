"""`python -m gpt2_numpy PROMPT ...` is a short form of `python -m gpt2_numpy.generate PROMPT ...`."""
from gpt2_numpy.commands.generate import main

main()
