"""Downloads, all offline: a local server (tests/http_server.py) plays OpenAI's store or a mirror.

Expected bytes are the files the server was given; expected URLs, folders and Range offsets come from the issue's
specification and simple arithmetic, never from the downloader's own output.
"""
import errno
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

from gpt2_numpy import download, weights
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.models import SOURCES, file_url, models_dir_path
from gpt2_numpy.errors import CheckpointError, DownloadError, Gpt2NumpyError, Interrupted, UsageError
from gpt2_numpy.formats.tf_bundle import TensorBundle
from gpt2_numpy.random_params import random_params
from gpt2_numpy.weights import ensure_model
from tests.conftest import FIXTURES, REPO
from tests.http_server import Cut, FileServer, Throttle, hf_layout_files, official_layout_files

OPENAI_FILES = ("checkpoint", "encoder.json", "hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001",
                "vocab.bpe")
DATA = "/124M/model.ckpt.data-00000-of-00001"
SMALL_CHUNK = 16384  # the tiny data file spans many of these; bytes of an unfinished chunk are lost at a cut
WAIT_SECONDS = 30  # upper bound for anything a test waits on; only reached when something is broken


@pytest.fixture(autouse=True)
def fast_and_isolated(monkeypatch, tmp_path):
    """No backoff waits, short timeouts, and no models dir or mirror leaking in from the environment."""
    monkeypatch.setattr(download, "BACKOFF_SECONDS", 0)
    monkeypatch.setattr(download, "CONNECT_TIMEOUT_SECONDS", 5)
    monkeypatch.setattr(download, "READ_TIMEOUT_SECONDS", 5)
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
    expected = {Path(url_path).name for url_path in files} | {weights.LOCK, weights.MARKER}
    assert {path.name for path in folder.iterdir()} == expected


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
        folder = ensure_model("124M", tmp_path / "models")
    assert folder == tmp_path / "models" / "124M"
    assert_installed(folder, files)
    assert sorted(server.requests) == sorted((path, None, 200) for path in files)  # each file once, no resumes
    stderr = capsys.readouterr().err
    assert str(folder) in stderr
    assert "model.ckpt.data-00000-of-00001: 100%" in stderr  # the per-file progress bar reached the end


def test_connection_cut_mid_file_resumes_with_range(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    kept = 5 * SMALL_CHUNK
    cuts = 5  # more than 1 + 3 retries: each cut adds bytes, so none of them counts against the retries
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)] * cuts}) as server:
        folder = ensure_model("124M", tmp_path)
    assert server.requested(DATA) == [None] + [f"bytes={n * kept}-" for n in range(1, cuts + 1)]
    assert_installed(folder, files)


@pytest.mark.parametrize("ignore_range, resumed_status", [(False, 206), (True, 200)])
def test_rerun_resumes_partial_file_or_restarts_when_range_is_ignored(tmp_path, monkeypatch, ignore_range,
                                                                       resumed_status):
    monkeypatch.setattr(download, "RETRIES", 0)  # the 503 after the cut ends the first run
    monkeypatch.setattr(download, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    kept = 10 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 7), 503]}, ignore_range=ignore_range) as server:
        with pytest.raises(DownloadError, match="503"):
            ensure_model("124M", tmp_path)
        assert layout_names_in(tmp_path / "124M") == set()
        folder = ensure_model("124M", tmp_path)
    data_requests = [(range_header, status) for path, range_header, status in server.requests if path == DATA]
    assert data_requests == [(None, 200), (f"bytes={kept}-", 503), (f"bytes={kept}-", resumed_status)]
    assert all(len(server.requested(path)) == 1 for path in files if path != DATA)  # finished files were kept
    assert_installed(folder, files)


def test_missing_file_404_fails_at_once_naming_the_url(tmp_path, monkeypatch):
    files = official_layout_files()
    del files["/124M/vocab.bpe"]
    with mirror(monkeypatch, files) as server:
        with pytest.raises(DownloadError, match=rf"{server.url}/124M/vocab\.bpe answered HTTP 404"):
            ensure_model("124M", tmp_path)
    assert server.requested("/124M/vocab.bpe") == [None]  # a 404 is not retried
    assert layout_names_in(tmp_path / "124M") == set()
    # the files before vocab.bpe stay staged for a rerun
    assert names_in(tmp_path / "124M" / weights.STAGING) == {"checkpoint", "hparams.json", "encoder.json"}


def test_server_errors_are_retried_3_times_with_doubling_waits_then_reported(tmp_path, monkeypatch):
    waits = []
    monkeypatch.setattr(download, "BACKOFF_SECONDS", 1.0)
    monkeypatch.setattr(download, "time", SimpleNamespace(sleep=waits.append))  # record the waits, skip them
    with mirror(monkeypatch, official_layout_files(), faults={"/124M/checkpoint": [503] * 4}) as server:
        with pytest.raises(DownloadError, match=r"/124M/checkpoint failed 4 times in a row \(HTTP 503"):
            ensure_model("124M", tmp_path)
    assert server.requested("/124M/checkpoint") == [None] * 4
    assert waits == [1, 2, 4]


def test_a_passing_retry_recovers_from_server_errors(tmp_path, monkeypatch):
    files = official_layout_files()
    with mirror(monkeypatch, files, faults={"/124M/encoder.json": [500, 502]}) as server:
        folder = ensure_model("124M", tmp_path)
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
            ensure_model("124M", tmp_path)
    folder = tmp_path / "124M"
    assert str(caught.value).startswith(str(folder / name))  # named where it will be, not inside .download/
    assert problem in str(caught.value)
    assert str(caught.value).endswith(f"deleted the downloaded {name}, so the next run fetches a fresh copy")
    assert names_in(folder) == {weights.LOCK, weights.STAGING}  # nothing under a final name, no marker
    assert names_in(folder / weights.STAGING) == set(OPENAI_FILES) - {name}  # the good files wait for a rerun
    with mirror(monkeypatch, files) as server:  # a good server afterwards fetches only the bad file again
        assert_installed(ensure_model("124M", tmp_path), files)
    assert server.requests == [(url_path, None, 200)]


def test_connection_refused_says_what_to_fetch_by_hand(tmp_path, monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound but not listening: every connection is refused
        base = f"http://127.0.0.1:{closed.getsockname()[1]}"
        monkeypatch.setenv("GPT2_NUMPY_BASE_URL", base)
        with pytest.raises(DownloadError) as caught:
            ensure_model("124M", tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"cannot download {base}/124M/")
    assert "Connection refused" in message
    assert all(f"{base}/124M/{name}" in message for name in OPENAI_FILES)
    assert f"into {tmp_path / '124M'}" in message
    assert names_in(tmp_path / "124M") == {weights.LOCK}  # no empty .download/ left behind


def test_no_dns_fails_at_once_with_the_manual_download_message(tmp_path, monkeypatch):
    attempts = []

    def unresolvable(self, url, **kwargs):  # what requests raises when the host name has no DNS answer
        attempts.append(url)
        no_answer = socket.gaierror(-2, "Name or service not known")
        reason = urllib3.exceptions.NameResolutionError("example", None, no_answer)
        raise requests.ConnectionError(urllib3.exceptions.MaxRetryError(None, url, reason))

    monkeypatch.setattr(requests.Session, "get", unresolvable)
    with pytest.raises(DownloadError) as caught:
        ensure_model("124M", tmp_path)
    assert len(attempts) == 1  # retrying cannot bring the network back
    assert "Name or service not known" in str(caught.value)
    assert all(f"/gpt-2/models/124M/{name}" in str(caught.value) for name in OPENAI_FILES)
    assert names_in(tmp_path / "124M") == {weights.LOCK}


def test_second_run_is_a_quick_offline_noop(tmp_path, monkeypatch, capsys):
    files = official_layout_files()
    with mirror(monkeypatch, files):
        folder = ensure_model("124M", tmp_path)
    capsys.readouterr()
    # the server is gone now, so any request would fail
    assert ensure_model("124M", tmp_path) == folder
    assert capsys.readouterr().err == ""  # what every generate run goes through: silent
    assert download.run(["124M", "--models-dir", str(tmp_path)]) == 0  # the command line's status and output
    output = capsys.readouterr()
    assert output.out == f"{folder}\n"
    assert "already complete" in output.err
    assert_installed(folder, files)


def test_a_deleted_file_is_fetched_again_alone(tmp_path, monkeypatch):
    files = official_layout_files()
    with mirror(monkeypatch, files) as server:
        folder = ensure_model("124M", tmp_path)
        (folder / "vocab.bpe").unlink()
        ensure_model("124M", tmp_path)
    assert server.requested("/124M/vocab.bpe") == [None, None]
    assert server.requested(DATA) == [None]
    assert_installed(folder, files)


def test_files_placed_by_hand_are_verified_once_without_network(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens there
    files = official_layout_files()
    folder = tmp_path / "124M"
    place_by_hand(folder, files)
    (folder / weights.STAGING).mkdir()  # a download given up before the user placed the files: no longer needed
    (folder / weights.STAGING / f"{Path(DATA).name}.part").write_bytes(b"\0" * 1000)
    assert ensure_model("124M", tmp_path) == folder
    assert_installed(folder, files)
    assert json.loads((folder / weights.MARKER).read_text()) == {
        Path(url_path).name: Path(source).stat().st_size for url_path, source in files.items()
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
        ensure_model("124M", tmp_path)
    assert str(caught.value).startswith(f"{data}: ")
    assert "CRC32C" in str(caught.value)
    assert str(caught.value).endswith(f"left {data.name} in {folder} untouched: replace the bad file with a good "
                                      "copy, or delete it so the next run downloads one")
    assert names_in(folder) == set(OPENAI_FILES) | {weights.LOCK}  # the user's files stay; no empty .download/
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
            ensure_model("124M", tmp_path)
        assert "deleted" not in str(caught.value)
        assert f"left {data.name} in {folder} untouched" in str(caught.value)
        assert layout_names_in(folder) == {Path(path).name for path in by_hand}  # no fetched bytes under final names
        fetched = {Path(path).name for path in files} - layout_names_in(folder)
        assert names_in(folder / weights.STAGING) == fetched
        shutil.copyfile(files[DATA], data)  # the user replaces the bad file
        requests_before = list(server.requests)
        assert_installed(ensure_model("124M", tmp_path), files)
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
            stopped = outcome(lambda: ensure_model("124M", tmp_path))
        assert {name: (folder / name).read_bytes() for name in placed_bytes} == placed_bytes  # back, unchanged
        assert isinstance(stopped, Interrupted if isinstance(stop, KeyboardInterrupt) else type(stop))
        assert not (folder / weights.MARKER).exists()
        # the rerun finds the damaged file where the user put it, names it, and keeps it
        with pytest.raises(CheckpointError) as caught:
            ensure_model("124M", tmp_path)
    assert f"left {data.name} in {folder} untouched" in str(caught.value)
    assert data.read_bytes() == damaged
    assert layout_names_in(folder) == set(placed_bytes)
    if by_hand == "all files":
        assert server.requests == []


@pytest.mark.parametrize("extra", [0, 10])
def test_a_part_as_long_as_the_file_is_kept_and_a_longer_one_starts_over(tmp_path, monkeypatch, capsys, extra):
    files = official_layout_files()
    data = files[DATA].read_bytes()
    staging = tmp_path / "124M" / weights.STAGING
    staging.mkdir(parents=True)
    (staging / f"{Path(DATA).name}.part").write_bytes(data + b"x" * extra)  # killed just before the rename
    with mirror(monkeypatch, files) as server:
        folder = ensure_model("124M", tmp_path)
    assert_installed(folder, files)
    if extra:  # the file on the server changed since: its 416 announces a shorter file
        assert server.requests_for(DATA) == [(f"bytes={len(data) + extra}-", 416), (None, 200)]
        assert "starting over" in capsys.readouterr().err
    else:  # 416 "bytes */N" for a part of N bytes: the part is the whole file
        assert server.requests_for(DATA) == [(f"bytes={len(data)}-", 416)]
        assert "starting over" not in capsys.readouterr().err


def test_a_resume_answered_from_byte_0_is_refused_and_the_part_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    data = files[DATA].read_bytes()
    kept = 5 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)]}, resume_from_zero=True) as server:
        with pytest.raises(DownloadError) as caught:
            ensure_model("124M", tmp_path)
    assert server.requested(DATA) == [None] + [f"bytes={kept}-"] * 4  # the cut, then 1 + 3 retries that add nothing
    assert f"Content-Range 'bytes 0-{len(data) - 1}/{len(data)}'" in str(caught.value)
    # appending the whole file after the kept bytes would have made a part that is neither file nor prefix
    assert (tmp_path / "124M" / weights.STAGING / f"{Path(DATA).name}.part").read_bytes() == data[:kept]


def test_a_part_growing_past_the_announced_size_is_deleted_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(download, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    size = files[DATA].stat().st_size
    kept = 5 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)]}, overlong=10 * SMALL_CHUNK) as server:
        folder = ensure_model("124M", tmp_path)
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
            ensure_model("124M", tmp_path)
    assert layout_names_in(folder) == set()
    assert not (folder / weights.MARKER).exists()


def test_without_hard_links_files_placed_by_hand_are_copied_for_verification(tmp_path, monkeypatch):
    def no_links(*args, **kwargs):  # as on FAT or some network shares
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    files = official_layout_files()
    by_hand = {path: source for path, source in files.items() if "model.ckpt" in path}
    place_by_hand(tmp_path / "124M", by_hand)
    with mirror(monkeypatch, files) as server:
        assert_installed(ensure_model("124M", tmp_path), files)
    assert sorted(path for path, _, _ in server.requests) == sorted(set(files) - set(by_hand))


def test_a_read_only_folder_is_verified_on_every_run_and_never_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://127.0.0.1:9")
    folder = tmp_path / "124M"
    place_by_hand(folder, official_layout_files())
    real_access = os.access
    # the tests run as root, whom file modes do not stop: the folder only looks read-only, as to another user
    monkeypatch.setattr(os, "access", lambda path, mode: real_access(path, mode) and not (
        Path(path) == folder and mode & os.W_OK))
    assert ensure_model("124M", tmp_path) == folder
    assert names_in(folder) == set(OPENAI_FILES)  # no lock file, no marker
    assert "read-only" in capsys.readouterr().err
    data = folder / Path(DATA).name
    data.write_bytes(flip_a_bit(data.read_bytes(), 0))
    with pytest.raises(CheckpointError, match="fails its CRC32C check"):  # verified again, not taken from a record
        ensure_model("124M", tmp_path)
    assert names_in(folder) == set(OPENAI_FILES)


def test_the_windows_lock_makes_a_second_holder_wait_for_the_first(tmp_path, monkeypatch, capsys):
    msvcrt = importlib.import_module("msvcrt" if sys.platform == "win32" else "tests.fake_msvcrt")
    monkeypatch.setattr(weights, "fcntl", None)
    monkeypatch.setattr(weights, "msvcrt", msvcrt)
    monkeypatch.setattr(weights, "LOCK_POLL_SECONDS", 0.01)
    folder = tmp_path / "124M"
    events, stderr = [], []

    def second_holder():
        with weights.locked(folder):
            events.append("the second holds the lock")

    with weights.locked(folder):
        second = threading.Thread(target=second_holder)
        second.start()
        wait_until(lambda: stderr.append(capsys.readouterr().err) or "in progress" in "".join(stderr))
        events.append("the first lets go")
    second.join(WAIT_SECONDS)
    assert events == ["the first lets go", "the second holds the lock"]


def test_huggingface_layout_downloads_and_loads(tmp_path, monkeypatch):
    files = hf_layout_files()
    with mirror(monkeypatch, files):
        folder = ensure_model("124M", tmp_path, source="huggingface")
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
    assert models_dir_path() == tmp_path / "weights"
    monkeypatch.setenv("GPT2_NUMPY_WEIGHTS", str(tmp_path / "from_env"))
    assert models_dir_path() == tmp_path / "from_env"
    assert models_dir_path(tmp_path / "from_arg") == tmp_path / "from_arg"


@pytest.mark.parametrize("size, source, wrong", [("125M", "openai", "'125M'"), ("124M", "tensorflow", "'tensorflow'")])
def test_unknown_size_or_source_is_a_usage_error(tmp_path, size, source, wrong):
    with pytest.raises(UsageError, match=wrong):
        ensure_model(size, tmp_path, source)
    assert list(tmp_path.iterdir()) == []


def test_models_dir_that_cannot_be_created_is_reported(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a folder cannot be made below a regular file, not even by root
    with pytest.raises(DownloadError, match=f"cannot write {blocker}.*: Not a directory; a file stands where a "
                                            "folder is needed: move it away or choose another folder with"):
        ensure_model("124M", blocker / "models")


@pytest.mark.parametrize("code, advice", [
    (errno.EACCES, "fix its permissions or choose another folder"),  # simulated: the tests may run as root
    (errno.EROFS, "the file system is read-only: choose another folder"),
    (errno.EDQUOT, "free some disk space or choose another folder"),
])
def test_file_system_errors_get_advice_that_fits(tmp_path, code, advice):
    path = tmp_path / "124M" / "model.ckpt.index"
    with pytest.raises(DownloadError) as caught:
        with weights.locked(tmp_path / "124M"):
            raise OSError(code, os.strerror(code), str(path))
    expected = f"cannot write {path}: {os.strerror(code)}; {advice} with --models-dir or GPT2_NUMPY_WEIGHTS"
    assert str(caught.value) == expected


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_full_disk_is_reported(tmp_path, monkeypatch):
    staging = tmp_path / "124M" / weights.STAGING
    staging.mkdir(parents=True)
    (staging / "checkpoint.part").symlink_to("/dev/full")  # every write there fails with ENOSPC
    with mirror(monkeypatch, official_layout_files()):
        with pytest.raises(DownloadError, match=f"cannot write {tmp_path / '124M'}: No space left on device; "
                                                "free some disk space"):
            ensure_model("124M", tmp_path)


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
                    "from gpt2_numpy import download; download.CHUNK_BYTES = 16384; download.main()")


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
    staging = models_dir / "124M" / weights.STAGING
    part = staging / f"{Path(DATA).name}.part"
    with FileServer(files, faults={DATA: [Throttle(100_000)]}) as server:  # 5 s for the data file, if not stopped
        env = {**os.environ, "GPT2_NUMPY_BASE_URL": server.url}
        first = start_small_chunk_cli(models_dir, env, "first")
        try:
            wait_until(lambda: download.file_size(part) >= 3 * SMALL_CHUNK)
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


def test_an_error_naming_no_file_deletes_every_download_and_keeps_the_users(tmp_path, monkeypatch):
    staging, folder = tmp_path / "124M" / ".download", tmp_path / "124M"
    staging.mkdir(parents=True)
    files = SOURCES["openai"].files
    for name in files:
        (staging / name).write_bytes(b"x")
    fetched, placed = files[:4], files[4:]  # the user placed the last two by hand

    def no_file_named(model_dir):  # e.g. "the model has 512 tokens but its vocabulary files only 257": the folder only
        raise CheckpointError(f"{model_dir}: the model has 512 tokens but its vocabulary files only 257")

    monkeypatch.setattr(weights, "check_model", no_file_named)
    with pytest.raises(DownloadError, match=f"deleted the downloaded {', '.join(fetched)}, so the next run"):
        weights.verify(staging, folder, files, fetched=fetched)
    assert sorted(path.name for path in staging.iterdir()) == sorted(placed)
