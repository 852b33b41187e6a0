"""A model's folder (gpt2_numpy/loading.py): where it is, and its first use, which reads each file once. Offline: a
local server (tests/http_server.py) plays OpenAI's store.

Expected counts come from the files the server serves (each read once, as the issue asks), expected folders from the
documented rule (<models dir>/<size>, ~ being the home folder), never from the code's own output.
"""
import json
import os
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpt2_numpy import fetch
from gpt2_numpy.catalog import SOURCES
from gpt2_numpy.commands import download as download_command
from gpt2_numpy.loading import DOWNLOADS, MARKER, load_model, ready, where
from tests.http_server import FileServer, official_layout_files

OPENAI_FILES = SOURCES["openai"].files
READ_ONLY = getattr(os, "O_ACCMODE", 3)  # the access-mode bits of open's flags; O_RDONLY is 0 on every system


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):  # no backoff waits, and no models dir or mirror from the environment
    monkeypatch.setattr(fetch, "BACKOFF_SECONDS", 0)
    monkeypatch.delenv("GPT2_NUMPY_WEIGHTS", raising=False)
    monkeypatch.delenv("GPT2_NUMPY_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)


@contextmanager
def mirror(monkeypatch, files):  # a FileServer that GPT2_NUMPY_BASE_URL points at
    with FileServer(files) as server:
        monkeypatch.setenv("GPT2_NUMPY_BASE_URL", server.url)
        yield server


OPENED = []  # (path, flags) of every file the process opens by name while a test below listens, else None
LISTENING = []


def listen(event, args):  # an audit hook: the "open" event comes from open(), io.open and os.open alike
    if event == "open" and LISTENING and isinstance(args[0], (str, bytes, os.PathLike)):
        path, mode, flags = args
        OPENED.append((Path(os.fsdecode(path)), mode, flags))


sys.addaudithook(listen)  # a hook cannot be removed: it records only while LISTENING


@contextmanager
def counting_opens():  # -> the list that (path, mode, flags) of each file opened by name are added to
    OPENED.clear()
    LISTENING.append(True)
    try:
        yield OPENED
    finally:
        LISTENING.clear()


def reads(opened, root):  # -> Counter of the model files under root opened for reading, by name
    def for_reading(mode, flags):
        return ("r" in mode and "+" not in mode) if mode else (flags & READ_ONLY) == os.O_RDONLY

    return Counter(path.name for path, mode, flags in opened
                   if root in path.parents and path.name in OPENAI_FILES and for_reading(mode, flags))


def test_first_use_opens_each_file_for_reading_once(tmp_path, monkeypatch):
    # fetched, verified (every CRC32C, every shape, the vocabulary) and loaded: the verification is the load itself
    files = official_layout_files()
    with mirror(monkeypatch, files), counting_opens() as opened:
        model = load_model("124M", tmp_path / "models")
    assert reads(opened, tmp_path) == Counter(OPENAI_FILES)
    assert model.hparams["n_layer"] == 2  # the tiny model the server holds
    assert (tmp_path / "models" / "124M" / MARKER).is_file()  # and the verification is recorded
    with counting_opens() as opened:  # a later use reads each once too, unverified, its files memory-mapped
        load_model("124M", tmp_path / "models")
    assert reads(opened, tmp_path) == Counter(OPENAI_FILES)


def test_files_placed_by_hand_are_verified_by_their_first_load_alone(tmp_path, monkeypatch):
    folder = tmp_path / "124M"
    folder.mkdir()
    for url_path, source in official_layout_files().items():
        (folder / Path(url_path).name).write_bytes(Path(source).read_bytes())
    with counting_opens() as opened:
        load_model("124M", tmp_path)
    assert reads(opened, tmp_path) == Counter(OPENAI_FILES)
    assert json.loads((folder / MARKER).read_text()).keys() == set(OPENAI_FILES)


def test_a_tilde_in_the_models_dir_is_the_home_folder(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))  # what expanduser reads on POSIX
    monkeypatch.setenv("USERPROFILE", str(home))  # and on Windows
    monkeypatch.setenv("GPT2_NUMPY_WEIGHTS", "~/models")
    assert where("124M") == home / "models" / "124M"
    assert where("124M", "~/other", "huggingface") == home / "other" / "124M-hf"
    with mirror(monkeypatch, official_layout_files()):  # as the command line passes it: "--models-dir=~/m" is not
        assert download_command.run(["124M", "--models-dir=~/m"]) == 0  # expanded by a shell
    assert sorted(path.name for path in (home / "m" / "124M").iterdir() if path.name in OPENAI_FILES) == sorted(
        OPENAI_FILES)
    assert not (tmp_path / "~").exists()  # no folder named "~" in the working folder


def test_a_second_name_a_killed_run_left_is_removed_before_the_next_download(tmp_path, monkeypatch):
    # A run killed while verifying leaves .download/ holding second names (hard links) of the user's files. The next
    # download must remove them first: linking again over one, or copying the user's file onto itself, would fail
    files = official_layout_files()
    folder = tmp_path / "124M"
    staging = folder / DOWNLOADS
    staging.mkdir(parents=True)
    placed = {"encoder.json", "vocab.bpe", "hparams.json"}
    for url_path, source in files.items():
        if Path(url_path).name in placed:
            (folder / Path(url_path).name).write_bytes(Path(source).read_bytes())
            os.link(folder / Path(url_path).name, staging / Path(url_path).name)  # what the killed run left
    with mirror(monkeypatch, files) as server:
        assert ready("124M", tmp_path)[0] == folder
    fetched = {Path(path).name for path, _, status in server.requests if status == 200}
    assert fetched == set(OPENAI_FILES) - placed  # the user's files are not fetched again
    for url_path, source in files.items():
        assert (folder / Path(url_path).name).read_bytes() == Path(source).read_bytes(), url_path
        assert (folder / Path(url_path).name).stat().st_nlink == 1  # no second name is left anywhere
    assert not staging.exists()
