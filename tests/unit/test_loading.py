"""gpt2_numpy/loading.py: a model's folder, all offline (a local server, tests/http_server.py, plays OpenAI's store or
a mirror): where it is; its first use, which reads each file once; the lock; what a failed verification blames, deletes
and keeps; files placed by hand; the record of a verified folder.

Expected bytes are the files the server was given, expected counts one read per file (as the issue asks), expected
folders the documented rule (<models dir>/<size>, ~ being the home folder), never the code's own output.
"""
import errno
import json
import os
import re
import shlex
import shutil
import sys
from collections import Counter
from contextlib import contextmanager
from functools import reduce
from operator import getitem
from pathlib import Path

import numpy as np
import pytest

from gpt2_numpy import formats, loading
from gpt2_numpy.catalog import SOURCES
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.commands import download as download_command
from gpt2_numpy.errors import CheckpointError, DownloadError, Gpt2NumpyError, Interrupted, UsageError
from gpt2_numpy.formats.tf_bundle import table_records
from gpt2_numpy.params import random_params
from gpt2_numpy.loading import DOWNLOAD_LOCK, DOWNLOADS, MARKER, load_model, ready, where
from tests.conftest import FIXTURES, UNREACHABLE
from scripts.common.fuzzing.tf_index import FIXED32, fields_of, fields_of_value, proto, set_field, table
from tests.http_server import FileServer, hf_layout_files, official_layout_files



from tests.download_helpers import (
    DATA, HF_PLACED_CONFIG, OPENAI_FILES, assert_installed, crc_pass_stopped_by, cut_at_a_line_end, flip_a_bit,
    layout_names_in, mirror, names_in, outcome, place_by_hand, published, ready_folder, tiny_vocabulary,
)
from tests.download_helpers import fast_and_isolated  # noqa: F401 (an autouse fixture)

READ_ONLY = getattr(os, "O_ACCMODE", 3)  # the access-mode bits of open's flags; O_RDONLY is 0 on every system


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


def reads(opened, root, names=OPENAI_FILES):  # -> Counter of the model files under root opened for reading, by name
    def for_reading(mode, flags):
        return ("r" in mode and "+" not in mode) if mode else (flags & READ_ONLY) == os.O_RDONLY

    opened_names = ((path.name.removesuffix(".part"), path, mode, flags) for path, mode, flags in opened)  # a part is
    return Counter(name for name, path, mode, flags in opened_names  # the file, before its rename
                   if root in path.parents and name in names and for_reading(mode, flags))


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


def test_a_download_checked_against_its_published_sha256_is_still_read_once(tmp_path, monkeypatch):
    # the hub publishes model.safetensors' SHA-256: it is taken as the bytes arrive, not by reading the file again
    files = hf_layout_files()
    weights = Path(files["/124M/model.safetensors"]).read_bytes()
    digest = published(weights)
    with FileServer(files, published={"/124M/model.safetensors": digest}) as server, counting_opens() as opened:
        monkeypatch.setenv("GPT2_NUMPY_BASE_URL", server.url)
        load_model("124M", tmp_path, source="huggingface")
    names = SOURCES["huggingface"].files
    assert reads(opened, tmp_path, names) == Counter(names)


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


def test_a_failed_first_download_leaves_no_folder_it_made(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", UNREACHABLE)
    (tmp_path / "kept" / "124M").mkdir(parents=True)  # folders of the user's, made before: they stay
    for models_dir in (tmp_path / "typo" / "models", tmp_path / "kept"):
        with pytest.raises(DownloadError, match="no network connection to 127.0.0.1:9"):
            ready_folder("124M", models_dir)
    assert names_in(tmp_path) == {"kept"}
    assert names_in(tmp_path / "kept" / "124M") == {DOWNLOAD_LOCK}


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


@pytest.mark.parametrize("marker", ["[1, 2]", "null", '"verified"', "{}"])
def test_a_marker_of_another_shape_means_verify_again(tmp_path, monkeypatch, capsys, marker):
    # valid JSON, but no {file name: stamp} object: the files are verified again and the marker rewritten, no traceback
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://127.0.0.1:9")
    folder = tmp_path / "124M"
    place_by_hand(folder, official_layout_files())
    (folder / MARKER).write_text(marker)
    assert not loading.is_complete(folder, SOURCES["openai"].files)
    assert ready_folder("124M", tmp_path) == folder
    assert f"verifying the files already in {folder}" in capsys.readouterr().err
    assert json.loads((folder / MARKER).read_text()).keys() == set(OPENAI_FILES)


def test_the_read_only_folder_s_hint_quotes_a_models_dir_holding_a_space(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://127.0.0.1:9")
    models_dir = tmp_path / "shared models"
    models_dir.mkdir()
    folder = models_dir / "124M"
    place_by_hand(folder, official_layout_files())
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: real_access(path, mode) and not (
        Path(path) == folder and mode & os.W_OK))  # read-only to this user (the tests run as root)
    assert ready_folder("124M", models_dir) == folder
    [command] = re.findall(r"run `([^`]+)` once with write access", capsys.readouterr().err)
    argv = shlex.split(command)
    assert argv[argv.index("--models-dir") + 1] == str(models_dir)  # pasted into a shell, the same folder


def resident_file_bytes():  # -> the bytes of mapped files this process holds in memory now (Linux's /proc)
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^RssFile:\s+(\d+) kB", status, re.M).group(1)) * 1024


def test_a_copied_weight_gives_back_its_mapped_pages_and_keeps_its_values(tmp_path):
    # load_model's decoding layout copies weights column-major; the mapped originals, read once for the copy, would
    # stay in the process's memory beside the copies. An array of the process's own memory must keep its values
    values = np.arange(4 << 20, dtype=np.float32).reshape(1024, 4096)  # 16 MB, rows of 16 KB
    path = tmp_path / "weights.bin"
    values.tofile(path)
    mapped = np.frombuffer(formats.map_file(path), np.float32).reshape(1024, 4096)[256:768]  # 8 MB in the middle
    before = resident_file_bytes()
    assert mapped.sum(dtype=np.float64) == values[256:768].sum(dtype=np.float64)  # every page read
    touched = resident_file_bytes()
    formats.release_pages(mapped)
    assert touched - before > 6 << 20 and touched - resident_file_bytes() > 6 << 20  # about 8 MB each way
    np.testing.assert_array_equal(mapped, values[256:768])  # read again from the file
    own = values.copy()
    formats.release_pages(own)
    np.testing.assert_array_equal(own, values)
