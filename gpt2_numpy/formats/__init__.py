"""Readers for the files GPT-2 weights ship in, with NumPy and the standard library only (no TensorFlow, no torch,
no pickle): TensorFlow tensor bundles (tf_bundle), safetensors (safetensors), and the CRC32C they rely on (crc32c).

The readers return arrays under the file's own tensor names; gpt2_numpy.checkpoint maps the names to our layout.
"""
import mmap
from pathlib import Path

from gpt2_numpy.errors import CheckpointError


def corrupt(path, problem):  # -> CheckpointError for a damaged or cut-off file, which a fresh download fixes
    return CheckpointError(f"{path}: {problem}; download the model again")


def unreadable(path, error):  # OSError -> CheckpointError naming the file
    if isinstance(error, FileNotFoundError):
        return CheckpointError(f"{path} is missing; download the model again")
    return CheckpointError(f"{path} cannot be read ({error.strerror or error}); check that it is a readable file or "
                           "folder, or download the model again")


def read_file(path):  # -> bytes
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise unreadable(path, error) from None


def map_file(path):  # -> read-only buffer of the whole file; arrays made from it are views, read lazily by the OS
    try:
        with open(path, "rb") as file:
            if file.seek(0, 2) == 0:
                return b""  # mmap refuses empty files; an empty buffer gives the same "truncated" errors
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)  # the mapping outlives the closed file
    except OSError as error:
        raise unreadable(path, error) from None
