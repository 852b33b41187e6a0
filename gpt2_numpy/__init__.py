"""GPT-2 in pure NumPy: run, score, look inside and train."""
import importlib

from gpt2_numpy.allocator import keep_freed_memory
from gpt2_numpy.formats.checkpoint import load_params, verify_checkpoint
from gpt2_numpy.errors import (
    CheckpointError, DownloadError, Gpt2NumpyError, OutOfVocabulary, TokenizerError, UsageError,
)
from gpt2_numpy.fast import gpt2, gpt2_cached, new_cache

# imported on first use (PEP 562), so that `import gpt2_numpy` stays quick. None is named like a submodule, which would
# replace it once imported: the decode loop is gpt2_numpy.decode.generate, and gpt2_numpy.generate runs a command
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
    "load_tokenizer",
    "EOT_ID",
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
