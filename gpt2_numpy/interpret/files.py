"""The files explain writes (--plot's picture, --html's page): checked before the model loads, so a typo costs no
load, and written whole or not at all."""
import os
from pathlib import Path

from gpt2_numpy.errors import UsageError
from gpt2_numpy.disk import atomic_write, disk_fix, write_problem


def check_output_file(path, flag, suffixes):  # -> None, or UsageError saying what is wrong with the file name
    """UsageError when `path` is a folder, does not end in one of `suffixes`, or lies in a folder that does not exist
    or that this user cannot write into."""
    names = " or ".join(suffixes)
    try:
        if path.is_dir():
            raise UsageError(f"{flag} {path} is a folder: name a {names} file")
        if path.suffix.lower() not in suffixes:
            raise UsageError(f"{flag} {path}: the file name must end in {names} (got "
                             f"{repr(path.suffix) if path.suffix else 'no suffix'})")
        folder = Path(os.path.realpath(path)).parent  # a symlink is written through to its file (atomic_write)
        existing = next(above for above in (folder, *folder.parents) if above.exists())
        if not existing.is_dir():
            raise UsageError(f"{flag} {path}: {existing} is a file, not a folder; choose another file")
        if not folder.is_dir():
            raise UsageError(f"{flag} {path}: the folder {folder} does not exist; create it or choose another file")
    except OSError as error:  # a folder on the way that this user may not enter
        raise UsageError(f"{flag} {path}: cannot read the folder {path.parent} ({error.strerror}): fix its "
                         "permissions or choose another file") from None
    problem = write_problem(folder)
    if problem:
        raise UsageError(f"{flag} {path}: cannot write into the folder {folder} {problem} or choose another file")


def write_atomically(path, write, what):  # write(binary file) -> None; disk.atomic_write, saying what failed
    try:
        atomic_write(path, write)
    except OSError as error:
        raise UsageError(f"cannot write {what} {path}: {error.strerror or error}: {disk_fix(error)} or choose "
                         "another file") from None
