"""GPT-2 in pure NumPy: generate, score, look inside and train."""
import importlib

from gpt2_numpy.allocator import keep_freed_memory
from gpt2_numpy.checkpoint import load_params, verify_checkpoint
from gpt2_numpy.errors import CheckpointError, DownloadError, Gpt2NumpyError, TokenizerError, UsageError
from gpt2_numpy.fast import gpt2, gpt2_cached, new_cache
from gpt2_numpy.tokenizer import EOT_ID, load_tokenizer

# imported on first use (PEP 562): importing gpt2_numpy.generate or .score here would load them before
# `python -m gpt2_numpy.generate` runs them as __main__, which Python warns about; and `import gpt2_numpy` stays quick.
# (generate itself stays gpt2_numpy.generate.generate: a package attribute named like a submodule is replaced by the
# submodule whenever that is imported.)
LAZY = {
    "gpt2_numpy.pipeline": ("Model", "load_model", "complete", "stream", "score_text"),
    "gpt2_numpy.score": ("token_log_probs",),
    "gpt2_numpy.explain": ("trace", "logit_lens", "attention_weights"),
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
    *LAZY_HOME,
]


def __getattr__(name):  # -> a name of LAZY, imported from its module the first time it is asked for
    if name in LAZY_HOME:
        return getattr(importlib.import_module(LAZY_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
