"""A model's folder made ready for use: every file present, verified once, and the verification recorded.

    folder = ensure_model("124M")  # what every command line calls, through cli.load_model

Where folders are and where files come from: see gpt2_numpy/models.py.

A folder is ready when <folder>/.verified.json records the size of every file and the sizes still match: runs after
the first compare sizes instead of re-reading gigabytes (delete the marker to verify again). Otherwise ensure_model,
holding the folder's lock (.download.lock):
- verifies the files already in the folder where they are. Files placed by hand are never moved, renamed or deleted:
  a bad one is named and left for the user to replace, and a Ctrl-C or a crash midway leaves everything as it was;
- downloads the missing ones (gpt2_numpy/download.py, whose network stack loads only then) into <folder>/.download/,
  verifies them there together with second names (hard links) of the files already present, and only then moves them
  into the folder, so that no final name ever holds unverified downloaded bytes. A bad download is deleted; the good
  ones stay staged for the next run.
Verifying means: the CRC32C of every tensor (TF) or the whole safetensors structure, every shape, and vocabulary files
that load and cover every token of the model.
"""
import errno
import json
import os
import shutil
import time
from contextlib import contextmanager, suppress

from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.errors import CheckpointError, DownloadError, Interrupted, TokenizerError, UsageError, log
from gpt2_numpy.models import MODEL_SIZES, SOURCES, model_folder
from gpt2_numpy.tokenizer import load_tokenizer

# The lock: flock where there is fcntl (POSIX), else msvcrt's byte lock (Windows). Both end with their process, so a
# crash never leaves a stale lock. With neither (no such platform runs NumPy today), importing still works and
# ensure_model goes on unlocked, saying so.
try:
    import fcntl

    msvcrt = None
except ImportError:
    fcntl = None
    try:
        import msvcrt
    except ImportError:
        msvcrt = None

STAGING = ".download"  # subfolder holding downloads until they are verified
MARKER = ".verified.json"  # {file name: size} of a verified folder
LOCK = ".download.lock"
LOCK_POLL_SECONDS = 1.0  # a waiting process asks for the lock this often (msvcrt cannot wait without a time limit)


# -- the public entry point ------------------------------------------------------------------------------------------

def ensure_model(size, models_dir=None, source="openai"):  # -> Path of the model folder, its files present and verified
    """Make GPT-2 `size` from `source` ready in the models dir and return its folder: download the missing files,
    verify the files not verified yet (once: the result is recorded in the folder). Raises a Gpt2NumpyError saying
    what is wrong: CheckpointError or TokenizerError for a bad file of the user's, DownloadError for a failed
    download, Interrupted for Ctrl-C."""
    folder, files = model_files(size, models_dir, source)
    if is_complete(folder, files):
        return folder
    if all_there(folder, files) and not os.access(folder, os.W_OK):  # e.g. a shared, read-only copy
        log(f"verifying the files in {folder}, which is read-only, so every run verifies them again: run "
            f"`python -m gpt2_numpy.download {size}` there once with write access to record the verification")
        verify(folder, folder, files, fetched=())
        return folder
    with locked(folder):
        if is_complete(folder, files):  # another process finished it while we waited for the lock
            log(f"GPT-2 {size} is already complete in {folder}: another process made it ready meanwhile")
        else:
            make_ready(folder, size, source)
    return folder


def model_files(size, models_dir, source):  # -> (folder, names of its files); UsageError for an unknown size or source
    checked_choice(size, MODEL_SIZES, "model size")
    checked_choice(source, tuple(SOURCES), "source")
    return model_folder(size, models_dir, source), SOURCES[source].files


def checked_choice(value, choices, what):  # -> value, or UsageError naming the valid choices
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return value


def is_complete(folder, files):  # -> True when a past run verified these files and their sizes still match
    try:
        verified_sizes = json.loads((folder / MARKER).read_text())
        return all((folder / name).stat().st_size == verified_sizes[name] for name in files)
    except (OSError, ValueError, KeyError, TypeError):  # no marker, a damaged one, or a file gone: not complete
        return False


def all_there(folder, files):  # -> True when every file exists under its final name
    return all((folder / name).exists() for name in files)


# -- verifying, downloading, installing ------------------------------------------------------------------------------

def make_ready(folder, size, source):  # -> None: every file present, verified and recorded in the marker
    files = SOURCES[source].files
    missing = [name for name in files if not (folder / name).exists()]
    if missing:
        log(f"downloading GPT-2 {size} from {source} into {folder}")
        download_and_install(folder, size, source, missing)
    else:
        log(f"verifying the files already in {folder}, once: later runs only compare their sizes with {MARKER}")
        verify(folder, folder, files, fetched=())
        shutil.rmtree(folder / STAGING, ignore_errors=True)  # leftover downloads, replaced by the user's own files
    (folder / MARKER).write_text(json.dumps({name: (folder / name).stat().st_size for name in files}))
    log(f"GPT-2 {size} is ready in {folder}")


def download_and_install(folder, size, source, missing):  # -> None: the missing files fetched, verified, in folder
    from gpt2_numpy.download import fetch_all  # the network stack (requests, tqdm: 14 MB, 0.15 s) loads only here

    files = SOURCES[source].files
    present = [name for name in files if name not in missing]
    staging = folder / STAGING
    staging.mkdir(exist_ok=True)
    try:
        fetch_all(folder, size, source, missing)
        for name in present:  # the whole model in one folder to verify, while the user's files stay where they are
            second_name(folder / name, staging / name)
        log("verifying checksums and vocabulary")
        verify(staging, folder, files, fetched=missing)
        for name in missing:
            os.replace(staging / name, folder / name)
        shutil.rmtree(staging)
    finally:
        for name in present:
            with suppress(FileNotFoundError):
                (staging / name).unlink()  # only the second name: the user's file keeps its own
        with suppress(OSError):  # after a failure, keep staging only when it holds files a rerun can reuse
            staging.rmdir()


def second_name(path, link):  # -> None: link holds path's bytes too; path itself is neither moved nor changed
    with suppress(FileNotFoundError):
        link.unlink()  # left by a killed run, or a download that the user's own copy of the file has replaced
    try:
        os.link(path, link)  # no byte is copied
    except OSError:  # a file system without hard links (FAT, some network shares): a copy, slower but as safe
        shutil.copyfile(path, link)


def verify(model_dir, folder, files, fetched):  # -> None, or raises once each bad download is deleted
    try:
        check_model(model_dir)
    except (CheckpointError, TokenizerError) as error:
        # the error names the bad file(s); when it names none, every file is suspect
        blamed = [name for name in files if str(model_dir / name) in str(error)] or list(files)
        deleted = [name for name in blamed if name in fetched]
        for name in deleted:  # a bad download goes; the good ones stay staged for the next run to reuse
            (model_dir / name).unlink()
        raise failed_verification(error, model_dir, folder, blamed, deleted) from None
    except KeyboardInterrupt:
        raise Interrupted(f"stopped verifying the files of {folder}; none was moved, changed or deleted: run again "
                          "to verify them") from None


def check_model(model_dir):  # -> None, or CheckpointError / TokenizerError naming what is wrong
    hparams, _ = load_params(model_dir, verify=True)
    n_vocab = load_tokenizer(model_dir).n_vocab
    if n_vocab < hparams["n_vocab"]:  # the model could choose ids the tokenizer cannot print
        raise CheckpointError(f"{model_dir}: the model has {hparams['n_vocab']:,} tokens but its vocabulary files "
                              f"only {n_vocab:,}; download the model again")


def failed_verification(error, model_dir, folder, blamed, deleted):  # -> error to raise: the fault and the files' fate
    detail = str(error).replace(str(model_dir), str(folder))  # name files where the user will look for them
    kept = [name for name in blamed if name not in deleted]
    fates = []
    if deleted:
        fates.append(f"deleted the downloaded {', '.join(deleted)}, so the next run fetches a fresh copy")
    if kept:
        fates.append(f"left {', '.join(kept)} in {folder} untouched: replace the bad file with a good copy, or delete "
                     "it so the next run downloads one")
    # a bad download is a failed download (exit 1); a bad file of the user's is bad input, as the loaders say (exit 2)
    return (DownloadError if deleted else type(error))("; ".join([detail, *fates]))


# -- the lock ---------------------------------------------------------------------------------------------------------

@contextmanager
def locked(folder):  # creates folder and holds its lock; a file-system error anywhere inside becomes a DownloadError
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # The file stays after use: deleting it while another process waits on it would let a third process lock a
        # fresh file, and two downloads would run at once.
        with (folder / LOCK).open("a") as lock:
            take_lock(lock, folder)
            try:
                yield
            finally:
                release_lock(lock)
    except OSError as error:  # fetch turns requests' errors (OSErrors too) into DownloadErrors: this is the disk
        raise DownloadError(f"cannot write {error.filename or folder}: {error.strerror or error}; "
                            f"{DISK_ADVICE.get(error.errno, OTHER_FOLDER)}") from None


def take_lock(lock, folder):  # -> None once this process holds the lock on the open file `lock`
    if not (fcntl or msvcrt):
        log(f"note: this system has no file locks (neither fcntl nor msvcrt): run one download into {folder} at a "
            "time")
    elif not try_lock(lock):
        log(f"another download into {folder} is in progress; waiting for it to finish")
        while not try_lock(lock):
            time.sleep(LOCK_POLL_SECONDS)


def try_lock(lock):  # -> True when this process now holds the lock, False while another process holds it
    try:
        if fcntl:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            lock.seek(0)  # msvcrt locks bytes from the current position: every process locks byte 0
            msvcrt.locking(lock.fileno(), msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):  # flock's EWOULDBLOCK, msvcrt's EACCES: held by another process
        return False
    return True


def release_lock(lock):  # -> None; flock ends when the file closes, but Windows releases msvcrt's lock only eventually
    if msvcrt and not fcntl:
        lock.seek(0)
        msvcrt.locking(lock.fileno(), msvcrt.LK_UNLCK, 1)


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
