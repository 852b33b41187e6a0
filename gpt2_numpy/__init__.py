"""GPT-2 in pure NumPy: run, score, look inside and train."""
from gpt2_numpy.allocator import keep_freed_memory
from gpt2_numpy.checkpoint import load_params, verify_checkpoint
from gpt2_numpy.decode import generate, generate_batch, iter_generate
from gpt2_numpy.errors import CheckpointError, DownloadError, Gpt2NumpyError, TokenizerError, UsageError
from gpt2_numpy.fast import gpt2, gpt2_cached, new_cache
from gpt2_numpy.interpret import attention_weights, logit_lens, trace
from gpt2_numpy.likelihood import token_log_probs
from gpt2_numpy.tokenizer import EOT_ID, load_tokenizer

__all__ = [
    "gpt2",
    "gpt2_cached",
    "new_cache",
    "keep_freed_memory",
    "load_params",
    "verify_checkpoint",
    "load_tokenizer",
    "EOT_ID",
    "generate",
    "generate_batch",
    "iter_generate",
    "token_log_probs",
    "trace",
    "logit_lens",
    "attention_weights",
    "Gpt2NumpyError",
    "UsageError",
    "CheckpointError",
    "TokenizerError",
    "DownloadError",
]
