"""A model's folder made ready for use: every file present, verified once, and the verification recorded.

    folder = ensure_model("124M")  # what every command line calls, through commands/common.model_from_args

Which sizes exist and where their files come from: gpt2_numpy/catalog.py; where they go: model_dirs.py. A folder is
ready when its verified marker (marker.py) still matches its files. Otherwise ensure_model, holding the folder's lock
(.download.lock, through locks.py):
- verifies the files already in the folder where they are (verification.py). Files placed by hand are never moved,
  renamed or deleted: a bad one is named and left for the user to replace, and a Ctrl-C or a crash midway leaves
  everything as it was;
- downloads the missing ones into a staging folder, verifies them there and only then moves them in (staging.py).
"""
import errno
import os
import shlex
import shutil
from contextlib import contextmanager, suppress

from gpt2_numpy.catalog import SOURCES
from gpt2_numpy.console import log
from gpt2_numpy.errors import DownloadError
from gpt2_numpy.locks import only_the_lock, open_lock, release_lock
from gpt2_numpy.marker import MARKER, is_complete, record, stamps
from gpt2_numpy.model_dirs import all_there, model_files
from gpt2_numpy.save import made_folders
from gpt2_numpy.staging import STAGING, download_and_install
from gpt2_numpy.verification import verify

LOCK = ".download.lock"


def ensure_model(size, models_dir=None, source="openai"):  # -> Path of the model folder, its files present and verified
    """Make GPT-2 `size` from `source` ready in the models dir and return its folder: download the missing files,
    verify the files not verified yet (once: the result is recorded in the folder). Raises a Gpt2NumpyError saying
    what is wrong: CheckpointError or TokenizerError for a bad file of the user's, DownloadError for a failed
    download, UsageError for a folder that cannot be read, Interrupted for Ctrl-C."""
    folder, files = model_files(size, models_dir, source)
    if is_complete(folder, files):
        return folder
    if all_there(folder, files) and not os.access(folder, os.W_OK):  # e.g. a shared, read-only copy
        log(f"verifying the files in {folder}, which is read-only, so every run verifies them again: run "
            f"`{download_command(size, folder, source)}` once with write access to record the verification")
        verify(folder, folder, SOURCES[source], fetched=())
        return folder
    with locked(folder):
        if is_complete(folder, files):  # another process finished it while we waited for the lock
            log(f"GPT-2 {size} is already complete in {folder}: another process made it ready meanwhile")
        else:
            make_ready(folder, size, source)
    return folder


def download_command(size, folder, source):  # -> the command line that makes this very folder ready
    return f"python -m gpt2_numpy.download {size} --source {source} --models-dir {shlex.quote(str(folder.parent))}"


def make_ready(folder, size, source):  # -> None: every file present, verified and recorded in the marker
    files = SOURCES[source].files
    missing = [name for name in files if not (folder / name).exists()]
    if missing:
        log(f"downloading GPT-2 {size} from {source} into {folder}")
        verified = download_and_install(folder, size, source, missing)
    else:
        log(f"verifying the files already in {folder}, once: later runs only compare their sizes and times with "
            f"{MARKER}")
        verified = stamps(folder, files)  # taken first: a change made while verifying shows as a changed stamp
        verify(folder, folder, SOURCES[source], fetched=())
        shutil.rmtree(folder / STAGING, ignore_errors=True)  # leftover downloads, replaced by the user's own files
    record(folder, verified)
    log(f"GPT-2 {size} is ready in {folder}")


@contextmanager
def locked(folder):  # creates folder and holds its lock; a file-system error anywhere inside becomes a DownloadError.
    # The folders it made go again if the work leaves nothing in them but the lock (a first download that failed)
    try:
        with made_folders(folder) as made, open_lock(folder / LOCK, made) as lock:
            try:
                yield
            finally:
                if made and only_the_lock(folder / LOCK):
                    with suppress(OSError):  # Windows deletes no open file: there the lock stays, harmless
                        (folder / LOCK).unlink()  # while still held: see open_lock
                release_lock(lock)
    except OSError as error:  # fetch turns requests' errors (OSErrors too) into DownloadErrors: this is the disk
        raise DownloadError(f"cannot write {error.filename or folder}: {error.strerror or error}; "
                            f"{DISK_ADVICE.get(error.errno, OTHER_FOLDER)}") from None


OTHER_FOLDER = "choose another folder with --models-dir or GPT2_NUMPY_WEIGHTS"
FULL_DISK = f"free some disk space or {OTHER_FOLDER}"
NOT_ALLOWED = f"fix its permissions or {OTHER_FOLDER}"
DISK_ADVICE = {  # what to do about a file-system error, by errno
    errno.ENOSPC: FULL_DISK,
    errno.EDQUOT: FULL_DISK,
    errno.EACCES: NOT_ALLOWED,
    errno.EPERM: NOT_ALLOWED,
    errno.EROFS: f"the file system is read-only: {OTHER_FOLDER}",
    errno.ENOTDIR: f"a file stands where a folder is needed: move it away or {OTHER_FOLDER}",
    errno.ENOENT: f"it or a folder above it is missing (removed meanwhile?): run again or {OTHER_FOLDER}",
}
