"""`python -m gpt2_numpy.train` runs the train command (gpt2_numpy/commands/train.py); the loop and the run folder live
in gpt2_numpy/training.py, the backward in gpt2_numpy/fast_backward.py, whose loss_and_grads is kept importable from
here."""
from gpt2_numpy.fast_backward import loss_and_grads

__all__ = ["loss_and_grads"]

if __name__ == "__main__":
    from gpt2_numpy.commands.train import main

    main()
