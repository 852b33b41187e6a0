"""Downloads, all offline: a local server (tests/http_server.py) plays OpenAI's store or a mirror.

Expected bytes are the files the server was given; expected URLs, folders and Range offsets come from the issue's
specification and simple arithmetic, never from the downloader's own output.
"""
import errno
import hashlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from functools import reduce
from types import SimpleNamespace
from operator import getitem
from pathlib import Path

import numpy as np
import pytest
import requests
import urllib3

from gpt2_numpy import fetch, loading, locks
from gpt2_numpy.catalog import SOURCES
from gpt2_numpy.fetch import file_url
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.commands import download as download_command
from gpt2_numpy.errors import CheckpointError, DownloadError, Gpt2NumpyError, Interrupted, UsageError
from gpt2_numpy.formats.tf_bundle import TensorBundle, table_records
from gpt2_numpy.params import random_params
from gpt2_numpy.tokenizer import bytes_to_unicode
from gpt2_numpy.loading import DOWNLOAD_LOCK, DOWNLOADS, MARKER, ready, where
from tests.conftest import FIXTURES, REPO, UNREACHABLE
from scripts.common.fuzzing.tf_index import FIXED32, fields_of, fields_of_value, proto, set_field, table
from tests.http_server import Cut, FileServer, Throttle, hf_layout_files, official_layout_files

OPENAI_FILES = ("checkpoint", "encoder.json", "hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001",
                "vocab.bpe")
DATA = "/124M/model.ckpt.data-00000-of-00001"
SMALL_CHUNK = 16384  # the tiny data file spans many of these; bytes of an unfinished chunk are lost at a cut
WAIT_SECONDS = 30  # upper bound for anything a test waits on; only reached when something is broken


@pytest.fixture(autouse=True)
def fast_and_isolated(monkeypatch, tmp_path):
    """No backoff waits, short timeouts, and no models dir or mirror leaking in from the environment."""
    monkeypatch.setattr(fetch, "BACKOFF_SECONDS", 0)
    monkeypatch.setattr(fetch, "CONNECT_TIMEOUT_SECONDS", 5)
    monkeypatch.setattr(fetch, "READ_TIMEOUT_SECONDS", 5)
    monkeypatch.delenv("GPT2_NUMPY_WEIGHTS", raising=False)
    monkeypatch.delenv("GPT2_NUMPY_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)


@contextmanager
def mirror(monkeypatch, files, **options):  # a FileServer that GPT2_NUMPY_BASE_URL points at
    with FileServer(files, **options) as server:
        monkeypatch.setenv("GPT2_NUMPY_BASE_URL", server.url)
        yield server


def assert_installed(folder, files):  # exactly the served files, byte for byte, and nothing half-done beside them
    for url_path, source in files.items():
        assert (folder / Path(url_path).name).read_bytes() == Path(source).read_bytes(), url_path
    expected = {Path(url_path).name for url_path in files} | {DOWNLOAD_LOCK, MARKER}
    assert {path.name for path in folder.iterdir()} == expected


def ready_folder(size, models_dir=None, source="openai"):  # -> the folder that loading.ready made ready
    return ready(size, models_dir, source)[0]


def layout_names_in(folder):  # -> the official file names present under their final names
    return {name for name in OPENAI_FILES if (folder / name).exists()}


def names_in(folder):  # -> names of everything in folder, an empty set when it does not exist
    return {path.name for path in folder.iterdir()} if folder.exists() else set()


def place_by_hand(folder, files):  # copies served files into folder under their final names
    folder.mkdir(exist_ok=True)
    for url_path, source in files.items():
        shutil.copyfile(source, folder / Path(url_path).name)


def flip_a_bit(data, where):  # -> data with one bit flipped at byte `where`
    damaged = bytearray(data)
    damaged[where] ^= 0x01
    return bytes(damaged)


def cut_at_a_line_end(data):  # -> the first half of data, ending after a whole line, as a cut-short file would
    return data[: data.index(b"\n", len(data) // 2) + 1]


def test_fresh_download_is_byte_exact_and_says_where(tmp_path, monkeypatch, capsys):
    files = official_layout_files()
    with mirror(monkeypatch, files) as server:
        folder = ready_folder("124M", tmp_path / "models")
    assert folder == tmp_path / "models" / "124M"
    assert_installed(folder, files)
    assert sorted(server.requests) == sorted((path, None, 200) for path in files)  # each file once, no resumes
    stderr = capsys.readouterr().err
    assert str(folder) in stderr
    assert "model.ckpt.data-00000-of-00001: 100%" in stderr  # the per-file progress bar reached the end


def test_connection_cut_mid_file_resumes_with_range(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    kept = 5 * SMALL_CHUNK
    cuts = 5  # more than 1 + 3 retries: each cut adds bytes, so none of them counts against the retries
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)] * cuts}) as server:
        folder = ready_folder("124M", tmp_path)
    assert server.requested(DATA) == [None] + [f"bytes={n * kept}-" for n in range(1, cuts + 1)]
    assert_installed(folder, files)


def test_a_connection_that_always_breaks_within_a_megabyte_still_gets_the_file(tmp_path, monkeypatch):
    # with a chunk of 1 MB, every cut lost all its bytes, and four such attempts gave up
    files = official_layout_files()
    with mirror(monkeypatch, files, faults={DATA: [Cut(100_000)] * 20}) as server:
        folder = ready_folder("124M", tmp_path)
    assert len(server.requested(DATA)) > 4  # more cuts than the retries allow, each of them progress
    assert_installed(folder, files)


@pytest.mark.parametrize("ignore_range, resumed_status", [(False, 206), (True, 200)])
def test_rerun_resumes_partial_file_or_restarts_when_range_is_ignored(tmp_path, monkeypatch, ignore_range,
                                                                       resumed_status):
    monkeypatch.setattr(fetch, "RETRIES", 0)  # the 503 after the cut ends the first run
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    kept = 10 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 7), 503]}, ignore_range=ignore_range) as server:
        with pytest.raises(DownloadError, match="503"):
            ready_folder("124M", tmp_path)
        assert layout_names_in(tmp_path / "124M") == set()
        folder = ready_folder("124M", tmp_path)
    data_requests = [(range_header, status) for path, range_header, status in server.requests if path == DATA]
    assert data_requests == [(None, 200), (f"bytes={kept}-", 503), (f"bytes={kept}-", resumed_status)]
    assert all(len(server.requested(path)) == 1 for path in files if path != DATA)  # finished files were kept
    assert_installed(folder, files)


def test_missing_file_404_fails_at_once_naming_the_url(tmp_path, monkeypatch):
    files = official_layout_files()
    del files["/124M/vocab.bpe"]
    with mirror(monkeypatch, files) as server:
        with pytest.raises(DownloadError, match=rf"{server.url}/124M/vocab\.bpe answered HTTP 404"):
            ready_folder("124M", tmp_path)
    assert server.requested("/124M/vocab.bpe") == [None]  # a 404 is not retried
    assert layout_names_in(tmp_path / "124M") == set()
    # the files before vocab.bpe stay staged for a rerun
    assert names_in(tmp_path / "124M" / DOWNLOADS) == {"checkpoint", "hparams.json", "encoder.json"}


def test_server_errors_are_retried_3_times_with_doubling_waits_then_reported(tmp_path, monkeypatch):
    waits = []
    monkeypatch.setattr(fetch, "BACKOFF_SECONDS", 1.0)
    monkeypatch.setattr(fetch, "time", SimpleNamespace(sleep=waits.append))  # record the waits, skip them
    with mirror(monkeypatch, official_layout_files(), faults={"/124M/checkpoint": [503] * 4}) as server:
        with pytest.raises(DownloadError, match=r"/124M/checkpoint failed 4 times in a row \(HTTP 503"):
            ready_folder("124M", tmp_path)
    assert server.requested("/124M/checkpoint") == [None] * 4
    assert waits == [1, 2, 4]


def test_a_passing_retry_recovers_from_server_errors(tmp_path, monkeypatch):
    files = official_layout_files()
    with mirror(monkeypatch, files, faults={"/124M/encoder.json": [500, 502]}) as server:
        folder = ready_folder("124M", tmp_path)
    assert server.requested("/124M/encoder.json") == [None] * 3
    assert_installed(folder, files)


@pytest.mark.parametrize("url_path, damage, problem", [
    (DATA, lambda data: flip_a_bit(data, len(data) // 2), "fails its CRC32C check"),  # a bit flipped inside a tensor
    # half of GPT-2's 50,000 merges, cut at a line end: only counting them can tell
    ("/124M/vocab.bpe", cut_at_a_line_end, "merges but the vocabulary needs 50,000"),
    ("/124M/encoder.json", lambda data: data[:-1], "not valid JSON"),  # the closing brace lost
])
def test_a_bad_download_is_deleted_alone_and_fetched_again(tmp_path, monkeypatch, url_path, damage, problem):
    files = official_layout_files()
    name = Path(url_path).name
    with mirror(monkeypatch, {**files, url_path: damage(files[url_path].read_bytes())}):
        with pytest.raises(DownloadError) as caught:
            ready_folder("124M", tmp_path)
    folder = tmp_path / "124M"
    assert str(caught.value).startswith(str(folder / name))  # named where it will be, not inside .download/
    assert problem in str(caught.value)
    assert str(caught.value).endswith(f"deleted the downloaded {name}, so the next run fetches a fresh copy")
    assert names_in(folder) == {DOWNLOAD_LOCK, DOWNLOADS}  # nothing under a final name, no marker
    assert names_in(folder / DOWNLOADS) == set(OPENAI_FILES) - {name}  # the good files wait for a rerun
    with mirror(monkeypatch, files) as server:  # a good server afterwards fetches only the bad file again
        assert_installed(ready_folder("124M", tmp_path), files)
    assert server.requests == [(url_path, None, 200)]


def test_connection_refused_says_what_to_fetch_by_hand(tmp_path, monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound but not listening: every connection is refused
        base = f"http://127.0.0.1:{closed.getsockname()[1]}"
        monkeypatch.setenv("GPT2_NUMPY_BASE_URL", base)
        with pytest.raises(DownloadError) as caught:
            ready_folder("124M", tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    # what the user meets first offline: no network, and what to do about it, before the URLs
    assert message.startswith(f"no network connection to 127.0.0.1:{base.rsplit(':', 1)[1]} (Connection refused): "
                              "without a network, train a tiny model and pass --model my-gpt (README.md, \"A first "
                              "run, offline\"); to download from a mirror, set GPT2_NUMPY_BASE_URL "
                              "(docs/weights-and-formats.md); to install by hand, download "), message
    assert "## A first run, offline\n" in (REPO / "README.md").read_text()  # the places it points to are there
    assert "GPT2_NUMPY_BASE_URL=" in (REPO / "docs" / "weights-and-formats.md").read_text()
    assert all(f"{base}/124M/{name}" in message for name in OPENAI_FILES)
    assert f"into {tmp_path / '124M'}" in message
    assert names_in(tmp_path) == set()  # the folder it made goes again: no empty .download/, no lock file left behind


def test_no_dns_fails_at_once_with_the_manual_download_message(tmp_path, monkeypatch):
    attempts = []

    def unresolvable(self, url, **kwargs):  # what requests raises when the host name has no DNS answer
        attempts.append(url)
        no_answer = socket.gaierror(-2, "Name or service not known")
        reason = urllib3.exceptions.NameResolutionError("example", None, no_answer)
        raise requests.ConnectionError(urllib3.exceptions.MaxRetryError(None, url, reason))

    monkeypatch.setattr(requests.Session, "get", unresolvable)
    with pytest.raises(DownloadError) as caught:
        ready_folder("124M", tmp_path)
    assert len(attempts) == 1  # retrying cannot bring the network back
    assert "Name or service not known" in str(caught.value)
    assert all(f"/gpt-2/models/124M/{name}" in str(caught.value) for name in OPENAI_FILES)
    assert names_in(tmp_path) == set()


def test_second_run_is_a_quick_offline_noop(tmp_path, monkeypatch, capsys):
    files = official_layout_files()
    with mirror(monkeypatch, files):
        folder = ready_folder("124M", tmp_path)
    capsys.readouterr()
    # the server is gone now, so any request would fail
    assert ready_folder("124M", tmp_path) == folder
    assert capsys.readouterr().err == ""  # what every generate run goes through: silent
    assert download_command.run(["124M", "--models-dir", str(tmp_path)]) == 0  # the command line's status and output
    output = capsys.readouterr()
    assert output.out == f"{folder}\n"
    assert "already complete" in output.err
    assert_installed(folder, files)
    # the size named as the other commands name a model, and the answer as data
    assert download_command.run(["--model", "124M", "--models-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"folder": str(folder), "files": list(SOURCES["openai"].files)}


def test_a_deleted_file_is_fetched_again_alone(tmp_path, monkeypatch):
    files = official_layout_files()
    with mirror(monkeypatch, files) as server:
        folder = ready_folder("124M", tmp_path)
        (folder / "vocab.bpe").unlink()
        ready_folder("124M", tmp_path)
    assert server.requested("/124M/vocab.bpe") == [None, None]
    assert server.requested(DATA) == [None]
    assert_installed(folder, files)


def test_files_placed_by_hand_are_verified_once_without_network(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens there
    files = official_layout_files()
    folder = tmp_path / "124M"
    place_by_hand(folder, files)
    (folder / DOWNLOADS).mkdir()  # a download given up before the user placed the files: no longer needed
    (folder / DOWNLOADS / f"{Path(DATA).name}.part").write_bytes(b"\0" * 1000)
    assert ready_folder("124M", tmp_path) == folder
    assert_installed(folder, files)
    assert json.loads((folder / MARKER).read_text()) == {  # what os.stat says of each file as placed
        name: [status.st_size, status.st_mtime_ns, status.st_ino]
        for name, status in ((Path(url_path).name, (folder / Path(url_path).name).stat()) for url_path in files)
    }
    stderr = capsys.readouterr().err
    assert f"verifying the files already in {folder}" in stderr
    assert "downloading" not in stderr


def test_corrupt_files_placed_by_hand_are_reported_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://127.0.0.1:9")
    folder = tmp_path / "124M"
    place_by_hand(folder, official_layout_files())
    data = folder / Path(DATA).name
    corrupt = flip_a_bit(data.read_bytes(), -1)
    data.write_bytes(corrupt)
    with pytest.raises(CheckpointError) as caught:  # bad input of the user's, not a failed download
        ready_folder("124M", tmp_path)
    assert str(caught.value).startswith(f"{data}: ")
    assert "CRC32C" in str(caught.value)
    assert str(caught.value).endswith(f"left {data.name} in {folder} untouched: replace the bad file with a good "
                                      "copy, or delete it so the next run downloads one")
    assert names_in(folder) == set(OPENAI_FILES) | {DOWNLOAD_LOCK}  # the user's files stay; no empty .download/
    assert data.read_bytes() == corrupt


def test_a_bad_file_placed_by_hand_keeps_the_fresh_downloads_for_the_rerun(tmp_path, monkeypatch):
    files = official_layout_files()
    by_hand = {path: source for path, source in files.items() if "model.ckpt" in path}
    folder = tmp_path / "124M"
    place_by_hand(folder, by_hand)
    data = folder / Path(DATA).name
    data.write_bytes(flip_a_bit(data.read_bytes(), 0))
    with mirror(monkeypatch, files) as server:
        with pytest.raises(CheckpointError) as caught:  # the user's file is bad, not the download
            ready_folder("124M", tmp_path)
        assert "deleted" not in str(caught.value)
        assert f"left {data.name} in {folder} untouched" in str(caught.value)
        assert layout_names_in(folder) == {Path(path).name for path in by_hand}  # no fetched bytes under final names
        fetched = {Path(path).name for path in files} - layout_names_in(folder)
        assert names_in(folder / DOWNLOADS) == fetched
        shutil.copyfile(files[DATA], data)  # the user replaces the bad file
        requests_before = list(server.requests)
        assert_installed(ready_folder("124M", tmp_path), files)
    assert server.requests == requests_before  # the rerun downloaded nothing again


def crc_pass_stopped_by(monkeypatch, exception):  # the CRC32C check of the first tensor raises exception instead
    real_read = TensorBundle.read

    def read(self, name, verify=False):
        if verify:
            raise exception
        return real_read(self, name, verify)

    monkeypatch.setattr(TensorBundle, "read", read)


def outcome(call):  # -> what call raised, even KeyboardInterrupt (which would stop pytest itself), or None
    try:
        call()
    except BaseException as error:
        return error
    return None


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), MemoryError()], ids=["Ctrl-C", "MemoryError"])
@pytest.mark.parametrize("by_hand", ["all files", "the checkpoint files"])
def test_verification_stopped_midway_leaves_the_files_placed_by_hand_where_they_are(tmp_path, monkeypatch, stop,
                                                                                   by_hand):
    files = official_layout_files()
    placed = files if by_hand == "all files" else {path: source for path, source in files.items() if "ckpt" in path}
    folder = tmp_path / "124M"
    place_by_hand(folder, placed)
    data = folder / Path(DATA).name
    damaged = flip_a_bit(data.read_bytes(), len(data.read_bytes()) // 2)
    data.write_bytes(damaged)
    placed_bytes = {name: (folder / name).read_bytes() for name in map(lambda path: Path(path).name, placed)}
    with mirror(monkeypatch, files) as server:
        with monkeypatch.context() as patch:
            crc_pass_stopped_by(patch, stop)
            stopped = outcome(lambda: ready_folder("124M", tmp_path))
        assert {name: (folder / name).read_bytes() for name in placed_bytes} == placed_bytes  # back, unchanged
        assert isinstance(stopped, Interrupted if isinstance(stop, KeyboardInterrupt) else type(stop))
        assert not (folder / MARKER).exists()
        # the rerun finds the damaged file where the user put it, names it, and keeps it
        with pytest.raises(CheckpointError) as caught:
            ready_folder("124M", tmp_path)
    assert f"left {data.name} in {folder} untouched" in str(caught.value)
    assert data.read_bytes() == damaged
    assert layout_names_in(folder) == set(placed_bytes)
    if by_hand == "all files":
        assert server.requests == []


@pytest.mark.parametrize("extra", [0, 10])
def test_a_part_as_long_as_the_file_is_kept_and_a_longer_one_starts_over(tmp_path, monkeypatch, capsys, extra):
    files = official_layout_files()
    data = files[DATA].read_bytes()
    staging = tmp_path / "124M" / DOWNLOADS
    staging.mkdir(parents=True)
    (staging / f"{Path(DATA).name}.part").write_bytes(data + b"x" * extra)  # killed just before the rename
    with mirror(monkeypatch, files) as server:
        folder = ready_folder("124M", tmp_path)
    assert_installed(folder, files)
    if extra:  # the file on the server changed since: its 416 announces a shorter file
        assert server.requests_for(DATA) == [(f"bytes={len(data) + extra}-", 416), (None, 200)]
        assert "starting over" in capsys.readouterr().err
    else:  # 416 "bytes */N" for a part of N bytes: the part is the whole file
        assert server.requests_for(DATA) == [(f"bytes={len(data)}-", 416)]
        assert "starting over" not in capsys.readouterr().err


def test_a_resume_answered_from_byte_0_is_refused_and_the_part_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    data = files[DATA].read_bytes()
    kept = 5 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)]}, resume_from_zero=True) as server:
        with pytest.raises(DownloadError) as caught:
            ready_folder("124M", tmp_path)
    assert server.requested(DATA) == [None] + [f"bytes={kept}-"] * 4  # the cut, then 1 + 3 retries that add nothing
    assert f"Content-Range 'bytes 0-{len(data) - 1}/{len(data)}'" in str(caught.value)
    # appending the whole file after the kept bytes would have made a part that is neither file nor prefix
    assert (tmp_path / "124M" / DOWNLOADS / f"{Path(DATA).name}.part").read_bytes() == data[:kept]


def test_a_part_growing_past_the_announced_size_is_deleted_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    size = files[DATA].stat().st_size
    kept = 5 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)]}, overlong=10 * SMALL_CHUNK) as server:
        folder = ready_folder("124M", tmp_path)
    # the resumed answer runs past the size it announced: the part goes, and the next request starts from byte 0
    # rather than asking to resume beyond the end of the file
    assert server.requests_for(DATA) == [(None, 200), (f"bytes={kept}-", 206), (None, 200)]
    assert f"more than the {size:,} bytes" in capsys.readouterr().err
    assert_installed(folder, files)


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_a_checkpoint_file_naming_weights_outside_the_folder_installs_nothing(tmp_path, monkeypatch, where):
    files = official_layout_files()
    folder = tmp_path / "124M"
    if where == "absolute":  # a valid checkpoint elsewhere on this machine
        prefix = str(FIXTURES / "tf_tiny" / "model.ckpt")
    else:  # a valid checkpoint beside the staging folder, which a relative path can climb to
        shutil.copytree(FIXTURES / "tf_tiny", folder / "x")
        prefix = "../x/model.ckpt"
    data = files[DATA].read_bytes()
    served = {**files, "/124M/checkpoint": f'model_checkpoint_path: "{prefix}"\n'.encode(),
              DATA: flip_a_bit(data, len(data) // 2)}  # the served weights are damaged; checking the others hides it
    with mirror(monkeypatch, served):
        with pytest.raises(Gpt2NumpyError):
            ready_folder("124M", tmp_path)
    assert layout_names_in(folder) == set()
    assert not (folder / MARKER).exists()


def test_without_hard_links_files_placed_by_hand_are_copied_for_verification(tmp_path, monkeypatch):
    def no_links(*args, **kwargs):  # as on FAT or some network shares
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    files = official_layout_files()
    by_hand = {path: source for path, source in files.items() if "model.ckpt" in path}
    place_by_hand(tmp_path / "124M", by_hand)
    with mirror(monkeypatch, files) as server:
        assert_installed(ready_folder("124M", tmp_path), files)
    assert sorted(path for path, _, _ in server.requests) == sorted(set(files) - set(by_hand))


def test_a_read_only_folder_is_verified_on_every_run_and_never_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://127.0.0.1:9")
    folder = tmp_path / "124M"
    place_by_hand(folder, official_layout_files())
    real_access = os.access
    # the tests run as root, whom file modes do not stop: the folder only looks read-only, as to another user
    monkeypatch.setattr(os, "access", lambda path, mode: real_access(path, mode) and not (
        Path(path) == folder and mode & os.W_OK))
    assert ready_folder("124M", tmp_path) == folder
    assert names_in(folder) == set(OPENAI_FILES)  # no lock file, no marker
    assert "read-only" in capsys.readouterr().err
    data = folder / Path(DATA).name
    data.write_bytes(flip_a_bit(data.read_bytes(), 0))
    with pytest.raises(CheckpointError, match="fails its CRC32C check"):  # verified again, not taken from a record
        ready_folder("124M", tmp_path)
    assert names_in(folder) == set(OPENAI_FILES)


def test_the_windows_lock_makes_a_second_holder_wait_for_the_first(tmp_path, monkeypatch, capsys):
    msvcrt = importlib.import_module("msvcrt" if sys.platform == "win32" else "tests.fake_msvcrt")
    monkeypatch.setattr(locks, "fcntl", None)
    monkeypatch.setattr(locks, "msvcrt", msvcrt)
    monkeypatch.setattr(locks, "LOCK_POLL_SECONDS", 0.01)
    folder = tmp_path / "124M"
    events, stderr = [], []

    def second_holder():
        with loading.locked(folder):
            events.append("the second holds the lock")

    with loading.locked(folder):
        second = threading.Thread(target=second_holder)
        second.start()
        wait_until(lambda: stderr.append(capsys.readouterr().err) or "in progress" in "".join(stderr))
        events.append("the first lets go")
    second.join(WAIT_SECONDS)
    assert events == ["the first lets go", "the second holds the lock"]


def test_a_failed_first_download_leaves_no_folder_it_made(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", UNREACHABLE)
    (tmp_path / "kept" / "124M").mkdir(parents=True)  # folders of the user's, made before: they stay
    for models_dir in (tmp_path / "typo" / "models", tmp_path / "kept"):
        with pytest.raises(DownloadError, match="no network connection to 127.0.0.1:9"):
            ready_folder("124M", models_dir)
    assert names_in(tmp_path) == {"kept"}
    assert names_in(tmp_path / "kept" / "124M") == {DOWNLOAD_LOCK}


@pytest.mark.parametrize("mirror", ["notaurl", "ftp://example.org/gpt-2", "127.0.0.1:8000"])
def test_a_mirror_that_is_no_http_address_is_refused_by_the_variable_s_name(tmp_path, monkeypatch, mirror):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", mirror)
    with pytest.raises(UsageError) as caught:
        ready_folder("124M", tmp_path)
    assert str(caught.value) == (f"GPT2_NUMPY_BASE_URL is {mirror!r}, not an http:// or https:// address: fix it, "
                                 "or unset it to download from the official servers")
    assert names_in(tmp_path) == set()


def test_a_waiter_whose_lock_file_was_deleted_locks_the_file_now_in_its_place(tmp_path, capsys):
    # the first holder made the folder and leaves nothing behind, so it deletes the lock file (and the folders) while
    # the second waits on that file: holding it, the second would shut out no one
    folder, checked, stderr = tmp_path / "models" / "124M", [], []

    def second_holder():
        with loading.locked(folder):
            with (folder / DOWNLOAD_LOCK).open("a") as third:  # another process's try, as the second holds the lock
                checked.append(locks.take_lock(third, folder, wait=False))

    with loading.locked(folder):
        second = threading.Thread(target=second_holder)
        second.start()
        wait_until(lambda: stderr.append(capsys.readouterr().err) or "in progress" in "".join(stderr))
    second.join(WAIT_SECONDS)
    assert checked == [False]
    # the second made the folders again, and leaving nothing but its lock there, it removes them as the first did
    assert list(tmp_path.iterdir()) == []


def test_huggingface_layout_downloads_and_loads(tmp_path, monkeypatch):
    files = hf_layout_files()
    with mirror(monkeypatch, files):
        folder = ready_folder("124M", tmp_path, source="huggingface")
    assert folder == tmp_path / "124M-hf"
    assert_installed(folder, files)
    config = json.loads((FIXTURES / "configs.json").read_text())["tiny"]
    hparams, params = load_params(folder)
    expected = random_params(config["hparams"], config["seed"])  # what the lead saved into hf_tiny
    assert hparams == config["hparams"]
    np.testing.assert_array_equal(params["wte"], expected["wte"])
    last_weight = ["blocks", 1, "mlp", "c_proj", "w"]
    np.testing.assert_array_equal(reduce(getitem, last_weight, params), reduce(getitem, last_weight, expected))


def test_default_urls_follow_the_official_stores(monkeypatch):
    assert file_url("124M", "openai", "vocab.bpe") == (
        "https://openaipublic.blob.core.windows.net/gpt-2/models/124M/vocab.bpe")
    assert file_url("1558M", "huggingface", "model.safetensors") == (
        "https://huggingface.co/openai-community/gpt2-xl/resolve/main/model.safetensors")
    assert file_url("355M", "huggingface", "config.json") == (
        "https://huggingface.co/openai-community/gpt2-medium/resolve/main/config.json")
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://mirror.example/gpt2/")
    assert file_url("774M", "huggingface", "merges.txt") == "http://mirror.example/gpt2/774M/merges.txt"


def test_models_dir_is_argument_then_environment_then_cwd_weights(tmp_path, monkeypatch):
    assert where("124M") == tmp_path / "weights" / "124M"
    monkeypatch.setenv("GPT2_NUMPY_WEIGHTS", str(tmp_path / "from_env"))
    assert where("124M", source="huggingface") == tmp_path / "from_env" / "124M-hf"
    assert where("124M", tmp_path / "from_arg") == tmp_path / "from_arg" / "124M"


def test_a_models_dir_that_is_a_file_is_a_usage_error_from_the_library_too(tmp_path):
    # the check lives in loading.where, so load_model("124M", models_dir=...) gets it as the command lines do
    (tmp_path / "models").write_text("not a folder")
    with pytest.raises(UsageError, match=f"the models dir {tmp_path / 'models'} is a file: pass a folder"):
        ready_folder("124M", tmp_path / "models")
    assert (tmp_path / "models").read_text() == "not a folder"


@pytest.mark.parametrize("size, source, wrong", [("125M", "openai", "'125M'"), ("124M", "tensorflow", "'tensorflow'")])
def test_unknown_size_or_source_is_a_usage_error(tmp_path, size, source, wrong):
    with pytest.raises(UsageError, match=wrong):
        ready_folder(size, tmp_path, source)
    assert list(tmp_path.iterdir()) == []


def test_models_dir_that_cannot_be_created_is_reported(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a folder cannot be made below a regular file, not even by root
    with pytest.raises(DownloadError, match=f"cannot write {blocker}.*: Not a directory; a file stands where a "
                                            "folder is needed: move it away or choose another folder with"):
        ready_folder("124M", blocker / "models")


@pytest.mark.parametrize("code, advice", [
    (errno.EACCES, "fix its permissions or choose another folder"),  # simulated: the tests may run as root
    (errno.EROFS, "its file system is read-only: remount it writable or choose another folder"),
    (errno.EDQUOT, "free some disk space or choose another folder"),
])
def test_file_system_errors_get_advice_that_fits(tmp_path, code, advice):
    path = tmp_path / "124M" / "model.ckpt.index"
    with pytest.raises(DownloadError) as caught:
        with loading.locked(tmp_path / "124M"):
            raise OSError(code, os.strerror(code), str(path))
    expected = f"cannot write {path}: {os.strerror(code)}; {advice} with --models-dir or GPT2_NUMPY_WEIGHTS"
    assert str(caught.value) == expected


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_full_disk_is_reported(tmp_path, monkeypatch):
    staging = tmp_path / "124M" / DOWNLOADS
    staging.mkdir(parents=True)
    (staging / "checkpoint.part").symlink_to("/dev/full")  # every write there fails with ENOSPC
    with mirror(monkeypatch, official_layout_files()):
        with pytest.raises(DownloadError, match=f"cannot write {tmp_path / '124M'}: No space left on device; "
                                                "free some disk space"):
            ready_folder("124M", tmp_path)


# -- the command line, in real processes ------------------------------------------------------------------------------

def start_cli(models_dir, env, name):  # -> Popen of the download CLI, its output in models_dir/../<name>.out/.err
    logs = models_dir.parent
    return subprocess.Popen(
        [sys.executable, "-m", "gpt2_numpy.download", "124M", "--models-dir", str(models_dir)],
        cwd=REPO, env=env, stdout=open(logs / f"{name}.out", "w"), stderr=open(logs / f"{name}.err", "w"),
    )


def wait_until(condition):
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting after {WAIT_SECONDS} s")
        time.sleep(0.05)


def test_two_processes_downloading_into_one_folder(tmp_path):
    files = official_layout_files()
    models_dir = tmp_path / "models"
    release = threading.Event()
    processes = []
    try:
        with FileServer(files, faults={DATA: [release]}) as server:  # the first process stalls on the data file
            env = {**os.environ, "GPT2_NUMPY_BASE_URL": server.url}
            processes.append(start_cli(models_dir, env, "first"))
            wait_until(lambda: server.requests)  # the first process holds the folder's lock from now on
            processes.append(start_cli(models_dir, env, "second"))
            wait_until(lambda: "in progress" in (tmp_path / "second.err").read_text())
            release.set()
            codes = [process.wait(WAIT_SECONDS) for process in processes]
    finally:
        release.set()
        for process in processes:
            process.kill()
    assert codes == [0, 0]
    folder = models_dir / "124M"
    assert [(tmp_path / f"{name}.out").read_text() for name in ("first", "second")] == [f"{folder}\n"] * 2
    assert "already complete" in (tmp_path / "second.err").read_text()
    assert all(len(server.requested(path)) == 1 for path in files)  # the second process fetched nothing
    assert_installed(folder, files)


def run_cli(*args, env=None):  # -> CompletedProcess of the download CLI
    return subprocess.run([sys.executable, "-m", "gpt2_numpy.download", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=WAIT_SECONDS)


def test_cli_unknown_size_is_one_line_and_exit_2(tmp_path):
    result = run_cli("125M", "--models-dir", str(tmp_path))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("error: unknown model size '125M'")
    assert result.stderr.count("\n") == 1


def test_cli_http_error_is_one_error_line_and_exit_1(tmp_path):
    files = official_layout_files()
    del files[DATA]
    with FileServer(files) as server:
        result = run_cli("124M", "--models-dir", str(tmp_path), env={**os.environ, "GPT2_NUMPY_BASE_URL": server.url})
    assert (result.returncode, result.stdout) == (1, "")
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert error_lines == [f"error: {server.url}{DATA} answered HTTP 404 Not Found: check the model size, and the "
                           "mirror in GPT2_NUMPY_BASE_URL if you set one"]


# Ctrl-C's Python handler is installed first: a child started with SIGINT ignored (as under a shell's `pytest &`)
# would otherwise ignore the SIGINT the test sends it
SMALL_CHUNKS_CLI = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "from gpt2_numpy import fetch; fetch.CHUNK_BYTES = 16384; "
                    "from gpt2_numpy.commands.download import main; main()")


def start_small_chunk_cli(models_dir, env, name):  # -> Popen: the download CLI writing every 16 KiB, as in-process
    logs = models_dir.parent
    return subprocess.Popen(
        [sys.executable, "-c", SMALL_CHUNKS_CLI, "124M", "--models-dir", str(models_dir)],
        cwd=REPO, env=env, stdout=open(logs / f"{name}.out", "w"), stderr=open(logs / f"{name}.err", "w"),
    )


@pytest.mark.skipif(sys.platform == "win32", reason="sends POSIX signals")
@pytest.mark.parametrize("stop", ["SIGKILL", "SIGINT"])
def test_a_download_stopped_mid_file_resumes_on_the_rerun_and_ends_byte_exact(tmp_path, stop):
    files = official_layout_files()
    models_dir = tmp_path / "models"
    staging = models_dir / "124M" / DOWNLOADS
    part = staging / f"{Path(DATA).name}.part"
    with FileServer(files, faults={DATA: [Throttle(100_000)]}) as server:  # 5 s for the data file, if not stopped
        env = {**os.environ, "GPT2_NUMPY_BASE_URL": server.url}
        first = start_small_chunk_cli(models_dir, env, "first")
        try:
            wait_until(lambda: fetch.bytes_in(part) >= 3 * SMALL_CHUNK)
            first.send_signal(getattr(signal, stop))
            code = first.wait(WAIT_SECONDS)
        finally:
            first.kill()
        kept = part.stat().st_size
        assert 0 < kept < files[DATA].stat().st_size
        second = start_small_chunk_cli(models_dir, env, "second")
        assert second.wait(WAIT_SECONDS) == 0
    assert server.requested(DATA) == [None, f"bytes={kept}-"]
    assert_installed(models_dir / "124M", files)
    if stop == "SIGINT":  # Ctrl-C: one line saying what was kept and that a rerun resumes
        assert code == 130
        last_line = (tmp_path / "first.err").read_text().splitlines()[-1]
        assert last_line.startswith("interrupted: ")
        assert f"{kept:,} bytes of {Path(DATA).name}" in last_line
        assert str(staging) in last_line and "resume" in last_line


def tiny_vocabulary(folder):  # -> None: a valid 257-token vocabulary (the 256 bytes and <|endoftext|>, no merges)
    encoder = {char: byte for byte, char in bytes_to_unicode().items()}
    (folder / "encoder.json").write_text(json.dumps({**encoder, "<|endoftext|>": 256}))
    (folder / "vocab.bpe").write_text("#version: 0.2\n")


def test_a_vocabulary_placed_by_hand_too_small_for_the_model_is_blamed_and_every_download_kept(tmp_path, monkeypatch):
    # the check compares encoder.json's size with hparams.json's n_vocab (512): the user's file is named, nothing goes
    files = official_layout_files()
    folder = tmp_path / "124M"
    folder.mkdir()
    tiny_vocabulary(folder)
    placed = {name: (folder / name).read_bytes() for name in ("encoder.json", "vocab.bpe")}
    with mirror(monkeypatch, files) as server:
        for _ in range(2):  # the rerun, the user's file unchanged, fails the same way without a request
            with pytest.raises(CheckpointError) as caught:
                ready_folder("124M", tmp_path)
            message = str(caught.value)
            assert message.startswith(f"{folder / 'encoder.json'}: the model has 512 tokens but its vocabulary files "
                                      "only 257")
            assert "left encoder.json in" in message and "hparams.json, kept for the next run" in message
            assert "deleted" not in message
            assert {name: (folder / name).read_bytes() for name in placed} == placed
            assert names_in(folder / DOWNLOADS) == set(OPENAI_FILES) - set(placed)
        assert sorted(path for path, _, _ in server.requests) == sorted(
            path for path in files if Path(path).name not in placed)  # each download once
        requests_before = len(server.requests)
        for name in placed:  # the user puts the right vocabulary in place
            shutil.copyfile(files[f"/124M/{name}"], folder / name)
        assert_installed(ready_folder("124M", tmp_path), files)
    assert len(server.requests) == requests_before  # nothing fetched twice


HF_PLACED_CONFIG = {"vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_head": 4, "n_layer": 3}  # tiny has 2


@pytest.mark.parametrize("source", ["openai", "huggingface"])
def test_hyperparameters_placed_by_hand_that_do_not_fit_the_download_are_blamed_alone(tmp_path, monkeypatch, source):
    files = official_layout_files() if source == "openai" else hf_layout_files()
    name = {"openai": "hparams.json", "huggingface": "config.json"}[source]
    folder = tmp_path / ("124M" if source == "openai" else "124M-hf")
    folder.mkdir()
    placed = dict(HF_PLACED_CONFIG) if source == "huggingface" else {
        "n_vocab": 512, "n_ctx": 64, "n_embd": 64, "n_head": 4, "n_layer": 3}
    (folder / name).write_text(json.dumps(placed))
    with mirror(monkeypatch, files) as server:
        for _ in range(2):
            with pytest.raises(CheckpointError) as caught:
                ready_folder("124M", tmp_path, source)
            message = str(caught.value)
            assert "lack blocks/2/" in message  # the weights have 2 layers, the user's file says 3
            assert f"left {name} in {folder} untouched (it does not fit the downloaded" in message
            assert "deleted" not in message
            assert names_in(folder / DOWNLOADS) == {Path(path).name for path in files} - {name}
        assert sorted(path for path, _, _ in server.requests) == sorted(set(files) - {f"/124M/{name}"})
        requests_before = len(server.requests)
        shutil.copyfile(files[f"/124M/{name}"], folder / name)
        assert_installed(ready_folder("124M", tmp_path, source), files)
    assert len(server.requests) == requests_before


def test_an_index_placed_by_hand_that_fails_the_downloaded_data_is_blamed_and_the_data_kept(tmp_path, monkeypatch):
    # the CRC32C check holds the downloaded data against the user's index: the index is blamed, the data stays staged
    files = official_layout_files()
    folder = tmp_path / "124M"
    folder.mkdir()
    index = folder / "model.ckpt.index"
    records = table_records(files["/124M/model.ckpt.index"].read_bytes())
    wte = dict(records)[b"model/wte"]
    crc = fields_of_value(wte)[6]
    edited = [(key, proto(set_field(fields_of(value), 6, FIXED32, crc ^ 1)) if key == b"model/wte" else value)
              for key, value in records]
    index.write_bytes(table(edited))  # a valid index whose stored CRC32C for model/wte is another
    with mirror(monkeypatch, files) as server:
        with pytest.raises(CheckpointError) as caught:
            ready_folder("124M", tmp_path)
        assert "tensor model/wte fails its CRC32C check" in str(caught.value)
        assert (f"left model.ckpt.index in {folder} untouched (it does not fit the downloaded "
                "model.ckpt.data-00000-of-00001") in str(caught.value)
        assert Path(DATA).name in names_in(folder / DOWNLOADS)
        requests_before = len(server.requests)
        shutil.copyfile(files["/124M/model.ckpt.index"], index)
        assert_installed(ready_folder("124M", tmp_path), files)
    assert len(server.requests) == requests_before  # the data file was fetched once


def test_served_hyperparameters_that_do_not_fit_the_served_weights_are_deleted_alone(tmp_path, monkeypatch):
    # every file came from the server: the hyperparameters, the suspect of a shape check, go; the weights stay staged
    files = official_layout_files()
    hparams = json.loads(files["/124M/hparams.json"].read_text())
    with mirror(monkeypatch, {**files, "/124M/hparams.json": json.dumps({**hparams, "n_layer": 3}).encode()}):
        with pytest.raises(DownloadError, match="deleted the downloaded hparams.json, so the next run fetches"):
            ready_folder("124M", tmp_path)
    assert names_in(tmp_path / "124M" / DOWNLOADS) == set(OPENAI_FILES) - {"hparams.json"}
    with mirror(monkeypatch, files) as server:
        assert_installed(ready_folder("124M", tmp_path), files)
    assert server.requests == [("/124M/hparams.json", None, 200)]


def test_an_error_naming_no_file_deletes_nothing(tmp_path, monkeypatch):
    staging, folder = tmp_path / "124M" / ".download", tmp_path / "124M"
    staging.mkdir(parents=True)
    files = SOURCES["openai"].files
    for name in files:
        (staging / name).write_bytes(b"x")

    def no_file_named(model_dir, name=None, source=None):  # an error about the folder as a whole
        raise CheckpointError(f"{model_dir} holds something odd")

    monkeypatch.setattr(loading, "read_model", no_file_named)
    with pytest.raises(CheckpointError) as caught:
        loading.verified_read(staging, folder, "openai", fetched=files[:4])
    assert str(caught.value) == f"{folder} holds something odd"
    assert sorted(path.name for path in staging.iterdir()) == sorted(files)


# -- Hugging Face: the SHA-256 the hub publishes -----------------------------------------------------------------------

HF_WEIGHTS = "/124M/model.safetensors"
HF_NAMES = {Path(path).name for path in hf_layout_files()}


def published(data):  # -> (sha256, size) as the hub publishes them for an LFS file
    return hashlib.sha256(data).hexdigest(), len(data)


def hub_like(files, weights_bytes):  # -> (files, FileServer options) that redirect model.safetensors to a store
    # as the hub does: the published hash comes on the redirect, and the store's answer has none
    store = "/store/" + hashlib.sha256(weights_bytes).hexdigest()
    return {**files, store: weights_bytes}, {"redirects": {HF_WEIGHTS: store}}


@pytest.mark.parametrize("redirected", [False, True], ids=["served", "redirected"])
def test_a_huggingface_download_matching_its_published_sha256_is_installed(tmp_path, monkeypatch, capsys, redirected):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = hf_layout_files()
    data = files[HF_WEIGHTS].read_bytes()
    served, options = hub_like(files, data) if redirected else (files, {})
    weights_path = options["redirects"][HF_WEIGHTS] if redirected else HF_WEIGHTS
    with mirror(monkeypatch, served, faults={weights_path: [Cut(3 * SMALL_CHUNK + 5)]},
                **{**options, "published": {HF_WEIGHTS: published(data)}}) as server:
        folder = ready_folder("124M", tmp_path, source="huggingface")
    assert server.requested(weights_path) == [None, f"bytes={3 * SMALL_CHUNK}-"]  # the hash covers both requests
    assert_installed(folder, files)
    assert "checking the SHA-256 of model.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize("redirected", [False, True], ids=["served", "redirected"])
@pytest.mark.parametrize("damage", ["a flipped byte", "a wrong size"])
def test_a_huggingface_download_unlike_its_published_sha256_is_deleted_and_fetched_again(tmp_path, monkeypatch,
                                                                                         damage, redirected):
    files = hf_layout_files()
    data = files[HF_WEIGHTS].read_bytes()
    served = flip_a_bit(data, len(data) - 10) if damage == "a flipped byte" else data  # inside the last tensor
    digest, size = published(data)
    announced = (digest, size) if damage == "a flipped byte" else (digest, size + 4)
    folder = tmp_path / "124M-hf"
    served_files, options = hub_like(files, served) if redirected else ({**files, HF_WEIGHTS: served}, {})
    with mirror(monkeypatch, served_files, **{**options, "published": {HF_WEIGHTS: announced}}):
        with pytest.raises(DownloadError) as caught:
            ready_folder("124M", tmp_path, source="huggingface")
    message = str(caught.value)
    if damage == "a flipped byte":
        assert f"has SHA-256 {hashlib.sha256(served).hexdigest()} but the server published {digest}" in message
    else:
        assert f"has {size:,} bytes but the server published X-Linked-Size {size + 4:,}" in message
    assert message.endswith("deleted it, so the next run fetches a fresh copy")
    assert names_in(folder) == {DOWNLOAD_LOCK, DOWNLOADS}  # nothing installed, no marker
    assert names_in(folder / DOWNLOADS) == HF_NAMES - {"model.safetensors"}
    with mirror(monkeypatch, files, published={HF_WEIGHTS: published(data)}) as server:
        assert_installed(ready_folder("124M", tmp_path, source="huggingface"), files)
    assert server.requests == [(HF_WEIGHTS, None, 200)]


def unlike_at_the_end(digest):  # -> a SHA-256 in hex equal to digest but for its last 4 digits
    return digest[:-4] + "".join(f"{(int(digit, 16) + 1) % 16:x}" for digit in digest[-4:])


def test_a_published_sha256_unlike_only_in_its_last_digits_is_refused(tmp_path, monkeypatch):
    files = hf_layout_files()
    digest, size = published(files[HF_WEIGHTS].read_bytes())
    announced = unlike_at_the_end(digest)
    assert announced[:60] == digest[:60] and announced != digest
    with mirror(monkeypatch, files, published={HF_WEIGHTS: (announced, size)}):
        with pytest.raises(DownloadError, match=f"has SHA-256 {digest} but the server published {announced} "):
            ready_folder("124M", tmp_path, source="huggingface")
    assert names_in(tmp_path / "124M-hf" / DOWNLOADS) == HF_NAMES - {"model.safetensors"}  # deleted


@pytest.mark.parametrize("damage", [None, "a flipped byte"])
def test_a_weak_x_linked_etag_is_checked_as_the_sha256_it_holds(tmp_path, monkeypatch, capsys, damage):
    # W/"<sha256>" does not promise identical bytes, and the hub has sent its hashes so: the file is held to the hash
    # all the same, since the structure check alone passes a flipped byte inside a tensor
    files = hf_layout_files()
    data = files[HF_WEIGHTS].read_bytes()
    served = flip_a_bit(data, len(data) - 10) if damage else data  # inside the last tensor
    digest, size = published(data)
    with mirror(monkeypatch, {**files, HF_WEIGHTS: served}, published={HF_WEIGHTS: (digest, size)},
                weak_etags=True) as server:
        assert requests.get(server.url + HF_WEIGHTS, timeout=WAIT_SECONDS).headers["X-Linked-Etag"] == f'W/"{digest}"'
        if damage:
            with pytest.raises(DownloadError, match=f"has SHA-256 {hashlib.sha256(served).hexdigest()} but the "
                                                    f"server published {digest} "):
                ready_folder("124M", tmp_path, source="huggingface")
        else:
            assert_installed(ready_folder("124M", tmp_path, source="huggingface"), files)
    assert "checking the SHA-256 of model.safetensors" in capsys.readouterr().err


# -- the record of a verified folder -----------------------------------------------------------------------------------

def test_a_verified_file_rewritten_in_place_with_the_same_size_is_verified_again(tmp_path, monkeypatch):
    files = official_layout_files()
    with mirror(monkeypatch, files):
        folder = ready_folder("124M", tmp_path)
    data = folder / Path(DATA).name
    with open(data, "r+b") as file:  # same size, same inode: only the time tells
        file.seek(len(data.read_bytes()) // 2)
        file.write(b"\xff\xff\xff\xff")
    with pytest.raises(CheckpointError, match="fails its CRC32C check"):
        ready_folder("124M", tmp_path)


def test_a_verified_folder_copied_elsewhere_is_verified_again(tmp_path, monkeypatch, capsys):
    files = official_layout_files()
    with mirror(monkeypatch, files):
        ready_folder("124M", tmp_path / "first")
    copy = shutil.copytree(tmp_path / "first" / "124M", tmp_path / "second" / "124M")  # sizes and times kept
    capsys.readouterr()
    assert ready_folder("124M", tmp_path / "second") == copy  # new inodes: verified once more, and good
    assert f"verifying the files already in {copy}" in capsys.readouterr().err
    shutil.copytree(tmp_path / "first" / "124M", tmp_path / "third" / "124M")
    data = tmp_path / "third" / "124M" / Path(DATA).name
    times = data.stat()
    data.write_bytes(flip_a_bit(data.read_bytes(), len(data.read_bytes()) // 2))
    os.utime(data, ns=(times.st_atime_ns, times.st_mtime_ns))  # a copy damaged, its time kept as a copy tool would
    with pytest.raises(CheckpointError, match="fails its CRC32C check"):
        ready_folder("124M", tmp_path / "third")


def test_a_file_as_new_as_the_record_is_verified_again(tmp_path, monkeypatch):
    # On a file system whose clock is coarse (2 s on FAT), a file rewritten just after the marker was written keeps the
    # time it had, the marker's: the record cannot tell the two apart, so such a file is verified again, as git does.
    files = official_layout_files()
    with mirror(monkeypatch, files):
        folder = ready_folder("124M", tmp_path)
    data = folder / Path(DATA).name
    times = data.stat()
    os.utime(folder / MARKER, ns=(times.st_atime_ns, times.st_mtime_ns))  # one tick for the file and marker
    with open(data, "r+b") as file:
        file.write(b"\xff\xff\xff\xff")
    os.utime(data, ns=(times.st_atime_ns, times.st_mtime_ns))  # the rewrite within the same tick: the time unchanged
    with pytest.raises(CheckpointError, match="fails its CRC32C check"):
        ready_folder("124M", tmp_path)


def test_a_safetensors_download_without_a_published_sha256_says_so(tmp_path, monkeypatch, capsys):
    files = hf_layout_files()
    with mirror(monkeypatch, files) as server:  # a mirror that sends no X-Linked-Etag
        assert_installed(ready_folder("124M", tmp_path, source="huggingface"), files)
    stderr = capsys.readouterr().err
    assert f"note: {server.url}{HF_WEIGHTS} came without a published SHA-256" in stderr
    assert stderr.count("without a published SHA-256") == 1  # config.json and the vocabulary never have one
