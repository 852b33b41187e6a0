"""GPT-2 inference in pure NumPy."""
from gpt2_numpy.errors import CheckpointError, DownloadError, Gpt2NumpyError, TokenizerError
from gpt2_numpy.model import gpt2, gpt2_cached, new_cache

__all__ = ["gpt2", "gpt2_cached", "new_cache", "Gpt2NumpyError", "CheckpointError", "TokenizerError", "DownloadError"]
