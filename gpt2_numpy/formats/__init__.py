"""Readers for the files GPT-2 weights ship in, with NumPy and the standard library only (no TensorFlow, no torch,
no pickle): TensorFlow tensor bundles (tf_bundle), safetensors (safetensors), and the CRC32C they rely on (crc32c).

The readers return arrays under the file's own tensor names; formats/checkpoint.py maps the names to our layout.
"""
import errno
import json
import math
import mmap
import os
import stat
from pathlib import Path

import numpy as np

from gpt2_numpy.errors import CheckpointError

MAX_DIMS = 32  # NumPy 1.x's limit on an array's dimensions
# A model folder may come from anyone, and a file read whole could be a symlink to /dev/zero: files read whole are
# refused past a size far above any real one's. Real sizes: config.json and hparams.json under 1 KB, checkpoint 77
# bytes; model.ckpt.index 5 KB for 124M (it grows with the number of tensors, not their size), encoder.json 1 MB and
# vocab.bpe 0.5 MB for 50,257 tokens: 64 MB still holds a vocabulary of a million tokens and its merges.
SETTINGS_LIMIT = 2**20  # bytes: config.json, hparams.json, checkpoint
TABLE_LIMIT = 64 * 2**20  # bytes: model.ckpt.index, encoder.json or vocab.json, vocab.bpe or merges.txt
READ_CHUNK = 2**16  # bytes
FILE_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a named pipe", stat.S_IFCHR: "a device",
              stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}
SHOWN_LIMIT = 100  # characters of a name read from a file that a message quotes
MAX_DIGITS = 4300  # of a JSON integer: Python 3.11's own limit, on every version (str -> int takes quadratic time)


def corrupt(path, problem, *compared):  # -> CheckpointError for a damaged or cut-off file, which a fresh download fixes
    # compared: files the check held path against (an index's CRC32C for a data file); path is the one at fault
    return CheckpointError(f"{path}: {problem}; download the model again", files=(path, *compared))


def unreadable(path, error):  # OSError -> CheckpointError naming the file
    if isinstance(error, FileNotFoundError):
        return CheckpointError(f"{path} is missing; download the model again", files=(path,))
    return CheckpointError(f"{path} cannot be read ({error.strerror or error}); check that it is a readable file or "
                           "folder, or download the model again", files=(path,))


def read_file(path, limit):  # -> bytes of a regular file of at most limit bytes; CheckpointError for anything else
    try:
        return read_regular(path, limit)
    except OSError as error:
        raise unreadable(path, error) from None


def read_text(path, fail, limit=None):  # -> the UTF-8 text of the file at path
    """The one text reader. fail(error) -> the exception each caller raises instead, saying what to do: error is an
    OSError when the file cannot be read (missing, a folder, over limit bytes when a limit is given) or a
    UnicodeDecodeError when it is not UTF-8. Without a limit, a pipe is read too (`--data <(...)`)."""
    try:
        data = read_regular(path, limit) if limit else Path(path).read_bytes()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise fail(error) from None


def read_regular(path, limit):  # -> bytes; OSError when path is missing, not a regular file, or over limit bytes
    data = bytearray()
    with open_regular(path) as file:  # in chunks: read(limit + 1) would allocate the whole limit for a small file
        while len(data) <= limit and (chunk := file.read(READ_CHUNK)):  # a byte past the limit is enough to refuse
            data += chunk
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"it is larger than {limit // 2**20} MB, far more than any model needs")
    return bytes(data)


def open_regular(path):  # -> the file at path, open for reading in binary; OSError when it is not a regular file
    # O_NONBLOCK: opening a FIFO would wait for a writer, forever; a regular file ignores the flag
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    kind = stat.S_IFMT(os.fstat(fd).st_mode)  # of the file opened: nothing can swap it between the check and the read
    if kind != stat.S_IFREG:
        os.close(fd)
        raise OSError(errno.EINVAL, f"it is {FILE_KINDS.get(kind, 'a special file')}, not a regular file")
    return open(fd, "rb")


def map_file(path):  # -> read-only buffer of the whole file; arrays made from it are views, read lazily by the OS
    try:
        with open_regular(path) as file:
            if file.seek(0, 2) == 0:
                return b""  # mmap refuses empty files; an empty buffer gives the same "truncated" errors
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)  # the mapping outlives the closed file
    except OSError as error:
        raise unreadable(path, error) from None


def release_pages(array):  # -> None; a view of a file map_file() mapped gives the process's memory of its whole
    # pages back (the page cache keeps them, and a later read maps them again); an array of the process's own memory,
    # whose pages would be lost, is left as it is, as is any array where madvise is missing (Windows)
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not (isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED")) or not (
            array.flags.c_contiguous or array.flags.f_contiguous):
        return
    start = array.ctypes.data - np.frombuffer(base, np.uint8).ctypes.data  # the array's bytes within the map
    first, end = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > first:  # pages the array fills alone: a neighbour's are left mapped
        base.madvise(mmap.MADV_DONTNEED, first, end - first)


def shown(text):  # -> text read from a file, fit for a one-line message: printable and short, else quoted and cut
    if text.isprintable() and len(text) <= SHOWN_LIMIT:
        return text
    return repr(text[:SHOWN_LIMIT]) + ("..." if len(text) > SHOWN_LIMIT else "")


def describe(value):  # -> a JSON value for a message, as JSON; arrays and objects by kind alone (they may be huge)
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    return shown(json.dumps(value))


def parse_json(text):  # JSON text (str or bytes) -> object; ValueError for anything but plain, unambiguous JSON
    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_constant=refuse_constant, parse_int=parse_int)
    except RecursionError:  # the decoder recurses once per level of nesting
        raise ValueError("it is nested too deeply") from None


def parse_int(digits):  # JSON integer text -> int
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"a number has {len(digits):,} digits")
    return int(digits)


def unique_keys(pairs):  # [(key, value)] of one JSON object -> dict; Python would silently keep a repeated key's last
    result = dict(pairs)
    if len(result) < len(pairs):
        seen = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {shown(repr(repeated))} appears twice")
    return result


def refuse_constant(name):  # NaN and Infinity are Python's extensions, not JSON
    raise ValueError(f"{name} is not a JSON value")


def check_shape(path, name, shape, itemsize):  # -> None; CheckpointError for a shape no NumPy array can take
    if len(shape) > MAX_DIMS:
        raise corrupt(path, f"tensor {shown(name)} has {len(shape):,} dimensions, more than NumPy's {MAX_DIMS}")
    # NumPy multiplies out every dimension (even beside a 0) and refuses products past its index type
    if math.prod(max(size, 1) for size in shape) * itemsize >= 2**63:
        raise corrupt(path, f"tensor {shown(name)} has shape {list(shape)}, too large for any array")
