"""`python -m gpt2_numpy.generate` runs the generate command (gpt2_numpy/commands/generate.py); the decode loop lives
in gpt2_numpy/decode.py, and its public names are kept importable from here."""
import sys
import types

from gpt2_numpy.decode import generate, generate_batch, iter_batch, iter_generate

__all__ = ["generate", "generate_batch", "iter_batch", "iter_generate"]


class CallableModule(types.ModuleType):
    """`gpt2_numpy.generate` names both this module and the function exported by the package, and importing the
    module replaces the package's attribute with it: so the module, called, is the function."""

    def __call__(self, *args, **options):
        return generate(*args, **options)


sys.modules[__name__].__class__ = CallableModule

if __name__ == "__main__":
    from gpt2_numpy.commands.generate import main

    main()
