"""GPT-2 in pure NumPy: run, score, look inside and train.

picoGPT's `generate(inputs, params, n_head, n_tokens_to_generate)` is `from gpt2_numpy.generate import generate`
(gpt2_numpy.decode.generate); `gpt2_numpy.generate` itself is the module that `python -m gpt2_numpy.generate` runs.
"""
import importlib

from gpt2_numpy.allocator import keep_freed_memory
from gpt2_numpy.formats.checkpoint import load_params, verify_checkpoint
from gpt2_numpy.errors import (
    CheckpointError, DownloadError, Gpt2NumpyError, OutOfVocabulary, TokenizerError, UsageError,
)
from gpt2_numpy.fast import gpt2, gpt2_cached, new_cache

# imported on first use (PEP 562), so that `import gpt2_numpy` stays quick. None is named like a submodule: importing
# gpt2_numpy.X binds X on the package, so a function exported as X would become the module X once anything imported it.
# generate, score, explain, train and download are therefore the modules that `python -m gpt2_numpy.X` runs and that
# 0.1.0 documented (`from gpt2_numpy import train; train.loss_and_grads`, `import gpt2_numpy.generate`). A picoGPT
# reader may expect `from gpt2_numpy import generate` to be the function, but one name cannot be both the module and a
# function without a hack: a callable module class, or a package refusing the import system's binding, which breaks
# `gpt2_numpy.generate.generate_batch`. picoGPT's generate is `from gpt2_numpy.generate import generate`, as the
# docstring above says.
LAZY = {
    "gpt2_numpy.pipeline": ("Model", "load_model", "complete", "stream", "score_text"),
    "gpt2_numpy.decode": ("generate_batch", "iter_generate"),
    "gpt2_numpy.likelihood": ("token_log_probs",),
    "gpt2_numpy.interpret": ("trace", "logit_lens", "attention_weights"),
    "gpt2_numpy.sae": ("load_sae", "save_sae"),
    # also so that `python -m gpt2_numpy.tokenizer` runs that module fresh, as the program (runpy warns otherwise)
    "gpt2_numpy.tokenizer": ("EOT_ID", "load_tokenizer"),
}
LAZY_HOME = {name: module for module, names in LAZY.items() for name in names}

__all__ = [
    "gpt2",
    "gpt2_cached",
    "new_cache",
    "keep_freed_memory",
    "load_params",
    "verify_checkpoint",
    "Gpt2NumpyError",
    "UsageError",
    "CheckpointError",
    "TokenizerError",
    "DownloadError",
    "OutOfVocabulary",
    *LAZY_HOME,
]


def __getattr__(name):  # -> a name of LAZY, imported from its module the first time it is asked for
    if name in LAZY_HOME:
        return getattr(importlib.import_module(LAZY_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
