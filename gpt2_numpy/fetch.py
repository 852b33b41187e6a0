"""Fetch the official GPT-2 files over HTTP: resumable, retried, and safe to interrupt.

Which files each model has: see gpt2_numpy/catalog.py. Where they come from: file_url; $GPT2_NUMPY_BASE_URL replaces
the servers with a mirror, which serves <base>/<SIZE>/<file> for either source. What happens to the files before and
after (the lock, verification by loading, installing, the record of a verified folder): see gpt2_numpy/loading.py,
which calls fetch_all with the staging folder to fill. The command line is gpt2_numpy/commands/download.py.

How: every missing file streams into <staging>/<name>.part (loading.py stages in <folder>/.download/), resumed with an
HTTP Range request after an interruption (Ctrl-C, a kill, a broken connection), and is renamed to <staging>/<name> once
its size matches what the server announced and its SHA-256 matches the one the server published, if it published one
(the Hugging Face hub does for its LFS files, such as model.safetensors). A part is never written past that size.
"""
import hashlib
import os
import re
import time
import urllib.parse

import requests
import urllib3

from gpt2_numpy.catalog import HF_REPOS, SOURCES
from gpt2_numpy.console import log, progress_bar
from gpt2_numpy.errors import DownloadError, Interrupted, UsageError

# Network behaviour; tests shrink these so that failure cases finish in milliseconds.
CONNECT_TIMEOUT_SECONDS = 10
READ_TIMEOUT_SECONDS = 30  # longest silence tolerated in the middle of a file
RETRIES = 3  # retries after attempts that add no bytes; an attempt that makes progress resets the count
BACKOFF_SECONDS = 1.0  # the wait doubles after each fruitless attempt: 1, 2, 4 s, so an offline run fails in ~7 s
CHUNK_BYTES = 1 << 16  # a connection that breaks loses the chunk it was reading: 64 KB, not a megabyte


class Retry(Exception):
    """The server answered, but not with the bytes we need (5xx, a bad range, a short body): worth asking again."""


class Unreachable(DownloadError):
    """The server could not be reached or the connection kept breaking: the user may fetch the files by hand."""


class NotFound(DownloadError):
    """The server answered that it has no such file (HTTP 4xx): asking again cannot help."""


def fetch_all(folder, staging, size, source, missing):  # -> None: each missing file is complete in staging
    # folder: where the files will be installed, which a by-hand download is told to fill
    mirror = os.environ.get("GPT2_NUMPY_BASE_URL")
    if mirror and not mirror.lower().startswith(("http://", "https://")):  # else requests' "No scheme supplied"
        raise UsageError(f"GPT2_NUMPY_BASE_URL is {mirror!r}, not an http:// or https:// address: fix it, or unset "
                         "it to download from the official servers")
    with download_session() as session:
        for name in missing:
            try:
                fetch(session, file_url(size, source, name), staging / name)
            except Unreachable as error:  # most often no network at all: what to do first, the URLs last
                urls = " ".join(file_url(size, source, each) for each in missing)
                raise DownloadError(f"{error}: without a network, train a tiny model on the package's own text "
                                    "(gpt2-numpy train --data sample: --out my-gpt --n-layer 2 --n-embd 32 --steps "
                                    "20) and pass --model my-gpt; to download from a mirror, set GPT2_NUMPY_BASE_URL "
                                    f"to its address (it serves ADDRESS/{size}/FILE); to install by hand, download "
                                    f"{urls} into {folder}/") from None
            except KeyboardInterrupt:
                raise stopped(staging, missing) from None


def download_session():  # -> a requests.Session for fetch
    session = requests.Session()
    session.headers["Accept-Encoding"] = "identity"  # byte ranges and sizes refer to the stored bytes, not a compressed
    return session  # transfer


def file_url(size, source, name):  # -> the URL of one file of one model
    base = os.environ.get("GPT2_NUMPY_BASE_URL")
    if base:
        return f"{base.rstrip('/')}/{size}/{name}"  # a mirror holds <base>/<SIZE>/<file>, whatever the source
    return SOURCES[source].url.format(size=size, repo=HF_REPOS[size], name=name)


def stopped(staging, names):  # -> Interrupted saying what a download stopped by Ctrl-C keeps for the rerun
    part_sizes = {name: bytes_in(staging / f"{name}.part") for name in names}
    kept = [name for name in names if (staging / name).exists()]
    kept += [f"{part_size:,} bytes of {name}" for name, part_size in part_sizes.items() if part_size]
    if not kept:
        return Interrupted("the download stopped before its first byte arrived; run the same command again to start it")
    return Interrupted(f"the download stopped; kept {', '.join(kept)} in {staging}: run the same command again to "
                       "resume the download")


# -- one file over HTTP ----------------------------------------------------------------------------------------------

def fetch(session, url, path):  # -> None: path holds the complete file, fetched into <path>.part with resumes
    if path.exists():
        return  # completed by an earlier, interrupted run
    part = path.with_name(path.name + ".part")
    running = RunningSha256()
    failures = 0
    while True:
        size_before = bytes_in(part)
        try:
            published = fetch_into(session, url, part, running)
            break
        except (Retry, requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as error:
            if no_name_resolution(error):  # no DNS means no network here: say so now, not after a minute of retries
                raise gave_up(url, error) from None
            failures = 0 if bytes_in(part) > size_before else failures + 1
            if failures > RETRIES:
                raise gave_up(url, error) from None
            delay = BACKOFF_SECONDS * 2 ** max(failures - 1, 0)
            log(f"{url}: {reason(error)}; retrying in {delay:g} s")
            time.sleep(delay)
        except requests.RequestException as error:  # a malformed URL or a redirect loop: asking again cannot help
            raise DownloadError(f"cannot download {url}: {error}") from None
    check_published(url, part, published, running)
    os.replace(part, path)


def fetch_into(session, url, part, running):  # -> published_sha256's answer, after one request appending to part
    # raises Retry when the file is not complete yet
    offset = bytes_in(part)
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    timeout = (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS)
    with session.get(url, headers=headers, stream=True, timeout=timeout) as response:
        published = published_sha256(response)
        if response.status_code == 416 and response.headers.get("Content-Range") == f"bytes */{offset}":
            return published  # nothing lies past our last byte: the part is the whole file, stopped before its rename
        start, total = body_span(response, url, offset, part)
        write_body(response, part, start, total, running.at(part, start))
    if total is not None and bytes_in(part) != total:
        raise Retry(f"got {bytes_in(part):,} of {total:,} bytes")
    return published


def published_sha256(response):  # -> (lowercase hex SHA-256, size or None) the server published, or None
    # The hub answers a resolve URL with a redirect to its file store that carries the LFS file's SHA-256 as
    # X-Linked-Etag ("quoted hex") and its size as X-Linked-Size; requests follows it and keeps it in history.
    # Files kept in git, such as config.json, have no X-Linked-Etag (their ETag is a git hash, not checked here).
    # A weak etag, W/"<sha256>", is checked like a strong one. W/ only withholds the promise of identical bytes (a proxy
    # that may transform a body marks its etags so), and the hub has sent its LFS hashes marked weak
    # (huggingface_hub#1428). Ignoring it would install bytes nothing checked; checking it either proves them or
    # refuses them, so a weak value that is not the file's hash costs a refused download, never a corrupt model.
    for answer in (*response.history, response):
        digest = answer.headers.get("X-Linked-Etag", "").removeprefix("W/").strip('"').lower()
        if re.fullmatch(r"[0-9a-f]{64}", digest):
            size = answer.headers.get("X-Linked-Size", "")
            return digest, int(size) if size.isdigit() else None
    return None


def check_published(url, part, published, running):  # -> None; DownloadError, the part deleted, when it is not those
    # bytes
    if published is None:
        if part.stem.endswith(".safetensors"):  # the hub keeps these in LFS, with a published hash: say none came
            log(f"note: {url} came without a published SHA-256 (X-Linked-Etag): only its structure is checked")
        return
    digest, size = published
    if size is not None and bytes_in(part) != size:
        problem = f"has {bytes_in(part):,} bytes but the server published X-Linked-Size {size:,}"
    else:
        log(f"checking the SHA-256 of {part.stem}")
        actual = running.at(part, bytes_in(part)).hexdigest()
        if actual == digest:
            return
        problem = f"has SHA-256 {actual} but the server published {digest} (X-Linked-Etag): the bytes are corrupt"
    part.unlink()
    raise DownloadError(f"{url}: the download {problem}; deleted it, so the next run fetches a fresh copy")


class RunningSha256:
    """The SHA-256 of a part, taken as its bytes are written, so that checking a download does not read it again."""

    def __init__(self):
        self.digest, self.size = hashlib.sha256(), 0

    def at(self, part, start):  # -> self, holding the hash of part's first start bytes: bytes it has not seen written
        # (a part an earlier run left, one started over) are read once here
        if start < self.size:
            self.digest, self.size = hashlib.sha256(), 0
        if start > self.size:
            with open(part, "rb") as file:
                file.seek(self.size)
                while self.size < start and (chunk := file.read(min(CHUNK_BYTES, start - self.size))):
                    self.update(chunk)
        return self

    def update(self, chunk):  # -> None: chunk was written after the bytes hashed so far
        self.digest.update(chunk)
        self.size += len(chunk)

    def hexdigest(self):
        return self.digest.hexdigest()


def body_span(response, url, offset, part):  # -> (byte offset where the body goes, full file size or None)
    status = response.status_code
    if status == 200:  # a fresh start, or a server that ignored Range: the body is the whole file either way
        if offset:
            log(f"{url} ignored the request to resume at byte {offset:,}; starting over")
        length = response.headers.get("Content-Length")
        return 0, int(length) if length else None
    if status == 206:
        content_range = response.headers.get("Content-Range", "")
        found = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", content_range)
        if not found or int(found[1]) != offset:  # appending bytes that belong elsewhere would corrupt the file
            raise Retry(f"asked to resume at byte {offset:,}, the server answered Content-Range {content_range!r}")
        return offset, int(found[2])
    if status == 416:  # our partial file is longer than the server's file: it changed, so start over
        part.unlink()
        raise Retry("the partial download does not fit the file on the server; starting over")
    if status >= 500 or status in (408, 429):
        raise Retry(f"HTTP {status} {response.reason}")
    raise NotFound(f"{url} answered HTTP {status} {response.reason}: check the model size, and the mirror in "
                        f"GPT2_NUMPY_BASE_URL if you set one")


def write_body(response, part, start, total, running):  # -> None: the body into part from byte start, never past
    # byte total; running (holding the hash of the bytes before start) takes each chunk written
    with open(part, "ab" if start else "wb") as out, bytes_bar(part.stem, start, total) as bar:
        for chunk in response.iter_content(CHUNK_BYTES):
            if total is not None and out.tell() + len(chunk) > total:
                break
            out.write(chunk)
            running.update(chunk)
            bar.update(len(chunk))
        else:
            return  # the whole body fitted
    # more bytes than announced: the answer cannot be trusted, nor the part it was appended to
    part.unlink()
    raise Retry(f"the server sent more than the {total:,} bytes it announced; starting over")


def bytes_bar(name, start, total):  # -> a progress bar in bytes on stderr
    return progress_bar(total=total, initial=start, desc=name, unit="B", unit_scale=True, unit_divisor=1024)


def bytes_in(path):  # -> bytes in path, 0 when it does not exist
    return path.stat().st_size if path.exists() else 0


SHORT_REASONS = {  # for failures whose text holds no "[Errno N] ..." reason
    requests.exceptions.ChunkedEncodingError: "the connection broke off mid-file",
    requests.exceptions.ConnectTimeout: "the connection timed out",
    requests.exceptions.ReadTimeout: "the server stopped sending data",
}


def reason(error):  # -> a short reason such as "Connection refused", for one-line messages
    errno_text = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(error))
    if errno_text:
        return errno_text[1]
    return next((text for kind, text in SHORT_REASONS.items() if isinstance(error, kind)), str(error))


def no_name_resolution(error):  # -> True when the host name could not be resolved
    cause = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(cause, getattr(urllib3.exceptions, "NameResolutionError", ()))  # urllib3 1.x lacks the class


def gave_up(url, error):  # -> the DownloadError that ends the retries
    if isinstance(error, Retry):
        return DownloadError(f"{url} failed {RETRIES + 1} times in a row ({error}); try again later, or use a "
                             f"mirror via GPT2_NUMPY_BASE_URL")
    return Unreachable(f"no network connection to {urllib.parse.urlsplit(url).netloc} ({reason(error)})")
