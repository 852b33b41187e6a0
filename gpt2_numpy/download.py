"""Fetch the official GPT-2 checkpoints into the models dir: resumable, verified, safe against a second process.

    python -m gpt2_numpy.download SIZE [--models-dir DIR] [--source openai|huggingface]

Where files go and where they come from: see gpt2_numpy/models.py.

How: every missing file streams into <folder>/.download/<name>.part, resumed with an HTTP Range request after an
interruption, and is renamed to <folder>/.download/<name> once its size matches what the server announced. Then the
whole staged model is verified (CRC32C of every tensor, or the safetensors structure, and the vocabulary files) and
only then moved into <folder>, so a final name never holds unverified bytes. When verification fails, the file it
blames is deleted if it was downloaded (or left alone if it was already in <folder>), while the other downloaded files
stay staged for the next run. A marker, <folder>/.verified.json, records the verified sizes: later runs compare sizes
against it instead of re-reading gigabytes. A lock file serialises processes.
"""
import errno
import fcntl
import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager, suppress

import requests
import urllib3
from tqdm import tqdm

from gpt2_numpy.checkpoint import verify_checkpoint
from gpt2_numpy.errors import ArgumentParser, CheckpointError, DownloadError, TokenizerError, UsageError, log, run_cli
from gpt2_numpy.models import MODEL_SIZES, SOURCES, file_url, model_folder
from gpt2_numpy.tokenizer import load_tokenizer

# Network behaviour; tests shrink these so that failure cases finish in milliseconds.
CONNECT_TIMEOUT_SECONDS = 10
READ_TIMEOUT_SECONDS = 30  # longest silence tolerated in the middle of a file
RETRIES = 3  # retries after attempts that add no bytes; an attempt that makes progress resets the count
BACKOFF_SECONDS = 1.0  # the wait doubles after each fruitless attempt: 1, 2, 4 s, so an offline run fails in ~7 s
CHUNK_BYTES = 1 << 20

STAGING = ".download"  # subfolder holding files until the checkpoint verified
MARKER = ".verified.json"  # {file name: size} of a verified folder
LOCK = ".download.lock"


class Retry(Exception):
    """The server answered, but not with the bytes we need (5xx, a bad range, a short body): worth asking again."""


class Unreachable(DownloadError):
    """The server could not be reached or the connection kept breaking: the user may fetch the files by hand."""


def checked_choice(value, choices, what):  # -> value, or UsageError naming the valid choices
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return value


# -- the public entry point ------------------------------------------------------------------------------------------

def ensure_model(size, models_dir=None, source="openai"):  # -> Path of the verified model folder
    """Download GPT-2 `size` from `source` into the models dir unless a verified copy is already there."""
    checked_choice(size, MODEL_SIZES, "model size")
    files = SOURCES[checked_choice(source, tuple(SOURCES), "source")].files
    folder = model_folder(size, models_dir, source)
    if not is_complete(folder, files):
        with locked(folder):
            if not is_complete(folder, files):  # another process may have finished it while we waited
                install(folder, size, source)
                log(f"GPT-2 {size} is ready in {folder}")
                return folder
    log(f"GPT-2 {size} is already complete in {folder} (quick size check; delete {MARKER} there to re-verify)")
    return folder


def is_complete(folder, files):  # -> True when a past run verified these files and their sizes still match
    try:
        verified_sizes = json.loads((folder / MARKER).read_text())
        return all((folder / name).stat().st_size == verified_sizes[name] for name in files)
    except (OSError, ValueError, KeyError, TypeError):  # no marker, a damaged one, or a file gone: not complete
        return False


@contextmanager
def locked(folder):  # creates folder and holds its lock; a file-system error anywhere inside becomes a DownloadError
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # flock dies with its process, so a crash never leaves a stale lock. The file itself stays: deleting it while
        # another process waits on it would let a third process lock a fresh file, and two downloads would run at once.
        with open(folder / LOCK, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"another download into {folder} is in progress; waiting for it to finish")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield
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


# -- staging, verifying, installing ----------------------------------------------------------------------------------

def install(folder, size, source):  # -> None: folder holds every file, verified, and the marker
    files = SOURCES[source].files
    staging = folder / STAGING
    staging.mkdir(exist_ok=True)
    try:
        missing = [name for name in files if not (folder / name).exists()]
        log(f"downloading GPT-2 {size} from {source} into {folder}" if missing else
            f"verifying the files already in {folder}")
        fetch_all(folder, size, source, missing)
        present = [name for name in files if name not in missing]
        for name in present:  # gather one complete model to verify, without copying gigabytes
            os.replace(folder / name, staging / name)
        verify(folder, present, missing)
        for name in files:
            os.replace(staging / name, folder / name)
        (folder / MARKER).write_text(json.dumps({name: (folder / name).stat().st_size for name in files}))
        shutil.rmtree(staging)
    finally:
        with suppress(OSError):  # after a failure, keep staging only when it holds files a rerun can reuse
            staging.rmdir()


def fetch_all(folder, size, source, missing):  # -> None: each missing file is complete in folder/.download/
    with requests.Session() as session:
        # byte ranges and sizes must refer to the stored bytes, not to a compressed transfer
        session.headers["Accept-Encoding"] = "identity"
        for name in missing:
            try:
                fetch(session, file_url(size, source, name), folder / STAGING / name)
            except Unreachable as error:
                urls = " ".join(file_url(size, source, each) for each in missing)
                raise DownloadError(f"{error}; to install by hand, download {urls} into {folder}/") from None


def verify(folder, present, fetched):  # -> None, or DownloadError once each file is where the next run wants it
    staging = folder / STAGING
    log("verifying checksums and vocabulary")
    try:
        verify_checkpoint(staging)
        load_tokenizer(staging)
    except (CheckpointError, TokenizerError) as error:
        # the error names the bad file(s); when it names none, every file is suspect
        blamed = [name for name in present + fetched if str(staging / name) in str(error)] or present + fetched
        kept, deleted = [name for name in blamed if name in present], [name for name in blamed if name in fetched]
        for name in present:  # the user's files go back where the user put them
            os.replace(staging / name, folder / name)
        for name in deleted:  # a bad download goes; the good ones stay staged for the next run to reuse
            (staging / name).unlink()
        raise failed_verification(folder, error, kept, deleted) from None


def failed_verification(folder, error, kept, deleted):  # -> DownloadError: what is wrong and what became of the files
    detail = str(error).replace(str(folder / STAGING), str(folder))  # name files where the user will look for them
    fates = []
    if deleted:
        fates.append(f"deleted the downloaded {', '.join(deleted)}, so the next run fetches a fresh copy")
    if kept:
        fates.append(f"left {', '.join(kept)} in {folder} untouched: replace the bad file with a good copy, or delete "
                     "it so the next run downloads one")
    return DownloadError("; ".join([detail, *fates]))


# -- one file over HTTP ----------------------------------------------------------------------------------------------

def fetch(session, url, path):  # -> None: path holds the complete file, fetched into <path>.part with resumes
    if path.exists():
        return  # completed by an earlier, interrupted run
    part = path.with_name(path.name + ".part")
    failures = 0
    while True:
        size_before = file_size(part)
        try:
            fetch_into(session, url, part)
            break
        except (Retry, requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as error:
            if no_name_resolution(error):  # no DNS means no network here: say so now, not after a minute of retries
                raise gave_up(url, error) from None
            failures = 0 if file_size(part) > size_before else failures + 1
            if failures > RETRIES:
                raise gave_up(url, error) from None
            delay = BACKOFF_SECONDS * 2 ** max(failures - 1, 0)
            log(f"{url}: {describe(error)}; retrying in {delay:g} s")
            time.sleep(delay)
        except requests.RequestException as error:  # a malformed URL or a redirect loop: asking again cannot help
            raise DownloadError(f"cannot download {url}: {error}") from None
    os.replace(part, path)


def fetch_into(session, url, part):  # -> None: one request, appending to part; raises when the file is not complete
    offset = file_size(part)
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    timeout = (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS)
    with session.get(url, headers=headers, stream=True, timeout=timeout) as response:
        start, total = body_span(response, url, offset, part)
        with open(part, "ab" if start else "wb") as out, progress_bar(part.stem, start, total) as bar:
            for chunk in response.iter_content(CHUNK_BYTES):
                out.write(chunk)
                bar.update(len(chunk))
    if total is not None and file_size(part) != total:
        raise Retry(f"got {file_size(part)} of {total} bytes")


def body_span(response, url, offset, part):  # -> (byte offset where the body goes, full file size or None)
    status = response.status_code
    if status == 200:  # a fresh start, or a server that ignored Range: the body is the whole file either way
        if offset:
            log(f"{url} ignored the request to resume at byte {offset}; starting over")
        length = response.headers.get("Content-Length")
        return 0, int(length) if length else None
    if status == 206:
        found = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", response.headers.get("Content-Range", ""))
        if not found or int(found[1]) != offset:
            raise Retry(f"the server resumed with Content-Range {response.headers.get('Content-Range')!r}")
        return offset, int(found[2])
    if status == 416:  # our partial file is longer than the server's file: it changed, so start over
        part.unlink()
        raise Retry("the partial download does not fit the file on the server; starting over")
    if status >= 500 or status in (408, 429):
        raise Retry(f"HTTP {status} {response.reason}")
    raise DownloadError(f"{url} answered HTTP {status} {response.reason}: check the model size, and the mirror in "
                        f"GPT2_NUMPY_BASE_URL if you set one")


def progress_bar(name, start, total):  # -> a tqdm bar in bytes on stderr
    return tqdm(total=total, initial=start, desc=name, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr)


def file_size(path):  # -> bytes in path, 0 when it does not exist
    return path.stat().st_size if path.exists() else 0


SHORT_REASONS = {  # for failures whose text holds no "[Errno N] ..." reason
    requests.exceptions.ChunkedEncodingError: "the connection broke off mid-file",
    requests.exceptions.ConnectTimeout: "the connection timed out",
    requests.exceptions.ReadTimeout: "the server stopped sending data",
}


def describe(error):  # -> a short reason such as "Connection refused", for one-line messages
    errno_text = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(error))
    if errno_text:
        return errno_text[1]
    return next((text for kind, text in SHORT_REASONS.items() if isinstance(error, kind)), str(error))


def no_name_resolution(error):  # -> True when the host name could not be resolved
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(reason, getattr(urllib3.exceptions, "NameResolutionError", ()))  # urllib3 1.x lacks the class


def gave_up(url, error):  # -> the DownloadError that ends the retries
    if isinstance(error, Retry):
        return DownloadError(f"{url} failed {RETRIES + 1} times in a row ({error}); try again later, or use a "
                             f"mirror via GPT2_NUMPY_BASE_URL")
    return Unreachable(f"cannot download {url}: {describe(error)}")


# -- the command line ------------------------------------------------------------------------------------------------

def main(argv=None):  # console entry point: errors become one line on stderr and an exit status
    run_cli(run, argv)


def run(argv=None):  # -> exit status; prints the model folder on stdout, everything else on stderr
    parser = ArgumentParser(prog="python -m gpt2_numpy.download",
                            description="Download an official GPT-2 checkpoint, resuming and verifying it.")
    parser.add_argument("size", metavar="SIZE", help=f"model size: {', '.join(MODEL_SIZES)}")
    parser.add_argument("--models-dir", help="folder of model folders (default: $GPT2_NUMPY_WEIGHTS, else ./weights)")
    parser.add_argument("--source", default="openai",
                        help="openai (TensorFlow checkpoint, the default) or huggingface (safetensors)")
    args = parser.parse_args(argv)
    print(ensure_model(args.size, args.models_dir, args.source))
    return 0


if __name__ == "__main__":
    main()
