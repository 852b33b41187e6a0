"""`python -m gpt2_numpy.generate` runs the generate command (gpt2_numpy/commands/generate.py); the decode loop lives
in gpt2_numpy/decode.py, whose public names stay importable from here, the path that version 0.1.0 documented."""
from gpt2_numpy.decode import generate, generate_batch, iter_batch, iter_generate

__all__ = ["generate", "generate_batch", "iter_batch", "iter_generate"]

if __name__ == "__main__":
    from gpt2_numpy.commands.generate import main

    main()
