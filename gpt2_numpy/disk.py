"""Files written whole or not at all, folders made and unmade, staged files moved in, and what to do about a disk
that refuses a write. Every writer of the package goes through here: the marker, training runs, tokenizers, model
folders (save.py), the download (loading.py) and explain's output files.

    atomic_write(path, lambda file: file.write(data))  # a reader sees the old file or the new one, never half of one
"""
import errno
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path

from gpt2_numpy.errors import UsageError


def atomic_write(path, write):  # write(binary file) -> None; path then holds exactly what write wrote, or is unchanged
    """The one atomic writer: write fills a temporary file beside path, which reaches the disk before a rename makes it
    path, so a reader never sees half a file and a failure leaves the old one whole. OSError goes to the caller."""
    path = Path(os.path.realpath(path))  # through a symlink to its file, so that the link stays a link
    # hidden, unique to this call, and short whatever the length of path's name
    handle, temporary = tempfile.mkstemp(prefix=".gpt2_numpy-", suffix=".tmp", dir=path.parent)
    try:
        with open(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the bytes reach the disk before the rename makes them the file
        os.chmod(temporary, mode_for(path))
        os.replace(temporary, path)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temporary)


def mode_for(path):  # -> the permissions of path's new version: the old file's, else an ordinary new file's
    try:
        return stat.S_IMODE(os.stat(path).st_mode)  # a file the user made private stays private
    except FileNotFoundError:
        return 0o666 & ~current_umask()  # mkstemp makes its files private; a new file is an ordinary one


@contextmanager
def made_folders(folder):  # -> the folders made for folder, innermost first; after the block, those left empty go
    # so that work which fails (or writes nothing) leaves no trace of a folder it had to make, a mistyped one above all
    made = [path for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        yield made
    finally:
        for path in made:
            with suppress(OSError):
                path.rmdir()  # only an empty folder goes


# what to do about an OSError that writing a file met, by errno: every message about a disk says it in these words
DISK_FIXES = {
    errno.ENOSPC: "free some disk space",
    errno.EDQUOT: "free some disk space",
    errno.EACCES: "fix its permissions",
    errno.EPERM: "fix its permissions",
    errno.EROFS: "its file system is read-only: remount it writable",
    errno.ENOTDIR: "a file stands where a folder is needed: move it away",
    errno.ENOENT: "it or a folder above it is missing (removed meanwhile?): run again",
}


def disk_fix(error, other="fix that"):  # -> what to do about an OSError met writing: "free some disk space", ...;
    # other for an errno the table does not know
    return DISK_FIXES.get(error.errno, other)


def write_problem(folder):  # -> None when a file can be made in folder; else "(permission denied): fix its
    # permissions", "(read-only file system): its file system is read-only: remount it writable", ...
    # a real file, unnamed where the system allows: os.access cannot tell a read-only file system from permissions
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        return f"({(error.strerror or str(error)).lower()}): {disk_fix(error)}"


def check_folder_path(folder, flag):  # -> None; UsageError when folder is no folder and none can be made there: a
    # file, a symbolic link to nothing, or a file on the way. Checked before any work, which would be lost
    try:
        for path in (folder, *folder.parents):
            if path.is_dir():
                return
            if path == folder and path.exists():
                raise UsageError(f"{flag} {folder} is a file: pass a folder (it is created if missing)")
            if path.exists():
                raise UsageError(f"{flag} {folder}: {path} is a file, so no folder can be made below it: choose "
                                 "another folder")
            if path.is_symlink():
                raise UsageError(f"{flag} {folder}: {path} is a symbolic link to {os.readlink(path)}, which does "
                                 "not exist: create that folder, or choose another one")
    except OSError as error:  # a folder on the way that this user may not enter
        raise UsageError(f"{flag} {folder}: cannot read the folders on its way ({error.strerror}): fix their "
                         "permissions or choose another folder") from None


def current_umask():  # -> the process's umask; reading it means setting it, so it is set straight back
    umask = os.umask(0)
    os.umask(umask)
    return umask


def move_in(staging, folder, names):  # -> None: staging's files take their places in folder, in the order of names,
    # and staging goes (with anything left in it). The one move-in of staged files: a training run's save and a download
    for name in names:
        with suppress(FileNotFoundError):  # a move-in cut off midway and finished later: its first files moved already
            os.replace(staging / name, folder / name)
        fsync_folder(folder)  # each rename on the disk before the next: the first can be what makes the whole
    shutil.rmtree(staging)


def fsync_folder(folder):  # -> None: the names created or renamed in folder have reached the disk
    if os.name != "posix":  # Windows cannot open a folder to flush it
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
