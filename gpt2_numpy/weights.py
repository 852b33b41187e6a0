"""A model's folder made ready for use: every file present, verified once, and the verification recorded.

    folder = ensure_model("124M")  # what every command line calls, through commands/common.load_model

Which sizes exist and where their files come from: see gpt2_numpy/catalog.py. Where they go: models_dir_path.

A folder is ready when <folder>/.verified.json records every file's size, modification time and inode, and they still
match: runs after the first compare those, as git's index does, instead of re-reading gigabytes. A file rewritten in
place (a new time) or a folder copied elsewhere (new inodes) is verified again; delete the marker to force it.
Otherwise ensure_model, holding the folder's lock (.download.lock):
- verifies the files already in the folder where they are. Files placed by hand are never moved, renamed or deleted:
  a bad one is named and left for the user to replace, and a Ctrl-C or a crash midway leaves everything as it was;
- downloads the missing ones (gpt2_numpy/fetch.py, whose network stack loads only then; it checks each file against
  a SHA-256 the server publishes, as the Hugging Face hub does for model.safetensors) into <folder>/.download/,
  verifies them there together with second names (hard links) of the files already present, and only then moves them
  into the folder, so that no final name ever holds unverified downloaded bytes. A bad download is deleted; good ones
  stay staged for the next run, and are never deleted because a file of the user's disagrees with them.
Verifying means: the CRC32C of every tensor (TF) or the whole safetensors structure, every shape against the
hyperparameters, and vocabulary files that load and cover every token of the model.
"""
import errno
import json
import os
import shlex
import shutil
import time
from contextlib import contextmanager, suppress
from pathlib import Path

from gpt2_numpy.catalog import MODEL_SIZES, SOURCES
from gpt2_numpy.console import log
from gpt2_numpy.errors import CheckpointError, DownloadError, Interrupted, TokenizerError, UsageError
from gpt2_numpy.formats import SETTINGS_LIMIT, parse_json, read_regular
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.formats.vocabulary import check_model_vocabulary, read_encoder, read_merges
from gpt2_numpy.save import atomic_write, made_folders

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
MARKER = ".verified.json"  # {file name: [size, mtime_ns, inode]} of a verified folder, taken before verifying
LOCK = ".download.lock"
LOCK_POLL_SECONDS = 1.0  # a waiting process asks for the lock this often (msvcrt cannot wait without a time limit)


# -- the public entry point ------------------------------------------------------------------------------------------

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


def model_files(size, models_dir, source):  # -> (folder, names of its files); UsageError for an unknown size or source
    checked_choice(size, MODEL_SIZES, "model size")
    checked_choice(source, tuple(SOURCES), "source")
    return size_folder(size, models_dir, source), SOURCES[source].files


def models_dir_path(models_dir=None):  # -> absolute Path: the argument, else $GPT2_NUMPY_WEIGHTS, else ./weights
    chosen = models_dir or os.environ.get("GPT2_NUMPY_WEIGHTS") or "weights"
    return Path(chosen).expanduser().resolve()  # messages then name the real folder, not ".../main/../models"


def size_folder(size, models_dir=None, source="openai"):  # -> Path of one model's files; UsageError for a models dir
    # that is a file or cannot be read
    models_root = models_dir_path(models_dir)
    try:
        if models_root.exists() and not models_root.is_dir():
            raise UsageError(f"the models dir {models_root} is a file: pass a folder with --models-dir or "
                             "GPT2_NUMPY_WEIGHTS")
    except OSError as error:
        raise UsageError(f"cannot read the models dir {models_root} ({error.strerror}): fix its permissions or pass "
                         "another folder with --models-dir") from None
    return models_root / f"{size}{SOURCES[source].folder_suffix}"


def checked_choice(value, choices, what):  # -> value, or UsageError naming the valid choices
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return value


def download_command(size, folder, source):  # -> the command line that makes this very folder ready
    return f"python -m gpt2_numpy.download {size} --source {source} --models-dir {shlex.quote(str(folder.parent))}"


def is_complete(folder, files):  # -> True when a past run verified these files and none has changed since
    try:
        marker = folder / MARKER
        recorded = parse_json(read_regular(marker, SETTINGS_LIMIT))  # a named pipe or deep JSON: False, not a hang
        written = marker.stat().st_mtime_ns
        # A file whose time is not older than the marker may have changed within the same tick of the file-system
        # clock (a few ms; 2 s on FAT) after it was verified: it is verified again, as git treats "racily clean" files.
        return all(recorded[name] == stamp(folder / name) and recorded[name][1] < written for name in files)
    except (OSError, ValueError, KeyError, TypeError):  # no marker, a damaged or older one, or a file gone
        return False


def stamp(path):  # -> [size, mtime_ns, inode]: a rewrite changes the time, a copy the inode (and usually the time)
    status = path.stat()
    return [status.st_size, status.st_mtime_ns, status.st_ino]


def stamps(folder, names):  # -> {name: stamp} of files in folder
    return {name: stamp(folder / name) for name in names}


def all_there(folder, files):  # -> True when every file exists under its final name; UsageError if it cannot be read
    try:
        return all((folder / name).exists() for name in files)
    except OSError as error:  # the folder or one above it cannot be searched (EACCES): no file is reachable
        raise UsageError(f"cannot read {folder} ({error.strerror}): fix the permissions of that folder and those "
                         "above it, or choose another folder with --models-dir or GPT2_NUMPY_WEIGHTS") from None


# -- verifying, downloading, installing ------------------------------------------------------------------------------

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


def record(folder, verified):  # -> None: the marker, written whole or not at all
    atomic_write(folder / MARKER, lambda file: file.write(json.dumps(verified).encode()))


def download_and_install(folder, size, source, missing):  # -> stamps of the files verified, now all in folder
    from gpt2_numpy.fetch import fetch_all  # the network stack (requests, tqdm: 14 MB, 0.15 s) loads only here

    files = SOURCES[source].files
    present = [name for name in files if name not in missing]
    staging = folder / STAGING
    staging.mkdir(exist_ok=True)
    try:
        fetch_all(folder, staging, size, source, missing)
        for name in present:  # the whole model in one folder to verify, while the user's files stay where they are
            second_name(folder / name, staging / name)
        verified = {**stamps(folder, present), **stamps(staging, missing)}  # a rename keeps a stamp
        log("verifying checksums and vocabulary")
        verify(staging, folder, SOURCES[source], fetched=missing)
        for name in missing:
            os.replace(staging / name, folder / name)
        shutil.rmtree(staging)
    finally:
        for name in present:
            with suppress(FileNotFoundError):
                (staging / name).unlink()  # only the second name: the user's file keeps its own
        with suppress(OSError):  # after a failure, keep staging only when it holds files a rerun can reuse
            staging.rmdir()
    return verified


def second_name(path, link):  # -> None: link holds path's bytes too; path itself is neither moved nor changed
    with suppress(FileNotFoundError):
        link.unlink()  # left by a killed run, or a download that the user's own copy of the file has replaced
    try:
        os.link(path, link)  # no byte is copied
    except OSError:  # a file system without hard links (FAT, some network shares): a copy, slower but as safe
        shutil.copyfile(path, link)


def verify(model_dir, folder, source, fetched):  # -> None, or raises once each bad download is deleted
    try:
        check_model(model_dir, source)
    except (CheckpointError, TokenizerError) as error:
        compared = [Path(path).name for path in error.files if Path(path).name in source.files]
        blamed = blame(compared, fetched)
        deleted = [name for name in blamed if name in fetched]
        for name in deleted:  # a bad download goes; the good ones stay staged for the next run to reuse
            (model_dir / name).unlink()
        raise failed_verification(error, model_dir, folder, blamed, deleted, compared, fetched) from None
    except KeyboardInterrupt:
        raise Interrupted(f"stopped verifying the files of {folder}; none was moved, changed or deleted: run again "
                          "to verify them") from None


def blame(compared, fetched):  # -> names of the files to blame, from those a failed check compared (at fault first)
    # A download comes whole from the source (checked against a published hash where there is one): when the check
    # held it against a file of the user's, the user's file is blamed, and deleting the download would only fetch the
    # same bytes again. Downloads alone: the one at fault goes, so the next run fetches a fresh copy.
    users = [name for name in compared if name not in fetched]
    if compared and compared[0] in users:
        return compared[:1]
    return users or compared[:1]  # no file compared (an error about the folder): nothing is blamed or deleted


def check_model(model_dir, source):  # -> None, or CheckpointError / TokenizerError whose .files say what was compared
    hparams, _ = load_params(model_dir, verify=True)
    vocab, merges = (model_dir / name for name in source.vocabulary)
    with comparing(vocab):
        encoder = read_encoder(vocab)
    with comparing(merges, vocab):  # the merges must build exactly the tokens of the vocabulary
        read_merges(merges, encoder)
    check_model_vocabulary(len(encoder), hparams["n_vocab"], vocab, files=(vocab, model_dir / source.hparams))


@contextmanager
def comparing(*paths):  # a TokenizerError inside names the files its check compared, the one at fault first
    try:
        yield
    except TokenizerError as error:
        raise TokenizerError(str(error), files=paths) from None


def failed_verification(error, model_dir, folder, blamed, deleted, compared, fetched):  # -> the error to raise
    detail = str(error).replace(str(model_dir), str(folder))  # name files where the user will look for them
    kept = [name for name in blamed if name not in deleted]
    fates = []
    if deleted:
        fates.append(f"deleted the downloaded {', '.join(deleted)}, so the next run fetches a fresh copy")
    if kept:
        against = [name for name in compared if name in fetched]
        fit = f" (it does not fit the downloaded {', '.join(against)}, kept for the next run)" if against else ""
        fates.append(f"left {', '.join(kept)} in {folder} untouched{fit}: replace the bad file with a good copy, or "
                     "delete it so the next run downloads one")
    # a bad download is a failed download (exit 1); a bad file of the user's is bad input, as the loaders say (exit 2)
    return (DownloadError if deleted else type(error))("; ".join([detail, *fates]))


# -- the lock ---------------------------------------------------------------------------------------------------------

@contextmanager
def locked(folder):  # creates folder and holds its lock; a file-system error anywhere inside becomes a DownloadError.
    # The folders it made go again if the work leaves nothing in them but the lock (a first download that failed)
    try:
        with made_folders(folder) as made, open_lock(folder, made) as lock:
            try:
                yield
            finally:
                if made and only_the_lock(folder):
                    with suppress(OSError):  # Windows deletes no open file: there the lock stays, harmless
                        (folder / LOCK).unlink()  # while still held: see open_lock
                release_lock(lock)
    except OSError as error:  # fetch turns requests' errors (OSErrors too) into DownloadErrors: this is the disk
        raise DownloadError(f"cannot write {error.filename or folder}: {error.strerror or error}; "
                            f"{DISK_ADVICE.get(error.errno, OTHER_FOLDER)}") from None


def open_lock(folder, made):  # -> folder's lock file, open and locked by this process; folder and file made if missing
    # A holder whose work left nothing behind deletes the file (and the folders it made) on its way out (locked).
    # Whoever waited on that file then holds a lock that no one else can see, so it takes the lock again on the file
    # now under that name, and counts the folders it has to make again as made by itself (made: made_folders' list)
    while True:
        made += [path for path in (folder, *folder.parents) if not path.exists() and path not in made]
        folder.mkdir(parents=True, exist_ok=True)
        try:
            lock = (folder / LOCK).open("a")
        except FileNotFoundError:  # the folder went between the two calls: make it again
            continue
        take_lock(lock, folder)
        with suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(lock.fileno()), os.stat(folder / LOCK)):
                return lock
        lock.close()


def only_the_lock(folder):  # -> True when folder holds the lock file and nothing else
    try:
        return [path.name for path in folder.iterdir()] == [LOCK]
    except OSError:
        return False


def take_lock(lock, folder, what="download", wait=True):  # -> True once this process holds the lock on the open file
    # `lock`; False at once, when another process holds it, if not told to wait. what: the work the lock guards
    if not (fcntl or msvcrt):
        log(f"note: this system has no file locks (neither fcntl nor msvcrt): run one {what} into {folder} at a time")
    elif not try_lock(lock):
        if not wait:
            return False
        log(f"another {what} into {folder} is in progress; waiting for it to finish")
        while not try_lock(lock):
            time.sleep(LOCK_POLL_SECONDS)
    return True


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
