"""What the tests of a model's download share: a mirror on a local server (tests/http_server.py), the checks of an
installed folder, and the damage done to files. Expected bytes are the files the server was given; expected URLs,
folders and Range offsets come from the specification and simple arithmetic, never from the downloader's own output.
"""
import hashlib
import json
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpt2_numpy import fetch
from gpt2_numpy.formats.tf_bundle import TensorBundle
from gpt2_numpy.tokenizer import bytes_to_unicode
from gpt2_numpy.loading import DOWNLOAD_LOCK, MARKER, ready
from tests.conftest import REPO
from tests.http_server import FileServer, hf_layout_files


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


def run_cli(*args, env=None):  # -> CompletedProcess of the download CLI
    return subprocess.run([sys.executable, "-m", "gpt2_numpy.download", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=WAIT_SECONDS)


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


def tiny_vocabulary(folder):  # -> None: a valid 257-token vocabulary (the 256 bytes and <|endoftext|>, no merges)
    encoder = {char: byte for byte, char in bytes_to_unicode().items()}
    (folder / "encoder.json").write_text(json.dumps({**encoder, "<|endoftext|>": 256}))
    (folder / "vocab.bpe").write_text("#version: 0.2\n")


HF_PLACED_CONFIG = {"vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_head": 4, "n_layer": 3}  # tiny has 2


HF_WEIGHTS = "/124M/model.safetensors"


HF_NAMES = {Path(path).name for path in hf_layout_files()}


def published(data):  # -> (sha256, size) as the hub publishes them for an LFS file
    return hashlib.sha256(data).hexdigest(), len(data)


def hub_like(files, weights_bytes):  # -> (files, FileServer options) that redirect model.safetensors to a store
    # as the hub does: the published hash comes on the redirect, and the store's answer has none
    store = "/store/" + hashlib.sha256(weights_bytes).hexdigest()
    return {**files, store: weights_bytes}, {"redirects": {HF_WEIGHTS: store}}


def unlike_at_the_end(digest):  # -> a SHA-256 in hex equal to digest but for its last 4 digits
    return digest[:-4] + "".join(f"{(int(digit, 16) + 1) % 16:x}" for digit in digest[-4:])
