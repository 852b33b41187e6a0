"""`python -m gpt2_numpy.explain PROMPT ...` is `gpt2-numpy explain PROMPT ...`."""
from gpt2_numpy.commands.explain import main

main()
