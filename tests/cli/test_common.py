"""commands.common.model_from_args, the door every command line goes through: the folder it loads holds every file,
verified.

Files placed by hand are verified on their first use and the verification is recorded (.verified.json), so a damaged
file is refused with the downloader's own error line instead of generating garbage, and later runs only compare sizes.
Expected error lines come from the download CLI run on the same folder; expected text is Hugging Face's greedy
continuation (tests/fixtures/reference_tiny.npz), as in tests/cli/test_generate.py.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from argparse import Namespace
from contextlib import contextmanager

import numpy as np
import pytest

from gpt2_numpy.loading import MARKER
from gpt2_numpy.commands import common as cli
from gpt2_numpy.commands.common import model_from_args
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.formats.tf_bundle import TensorBundle
from gpt2_numpy.params import flatten, random_params
from gpt2_numpy.save import save_model
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY, load_tokenizer
from tests.conftest import FIXTURES, REPO, assert_one_error_line, official_path, tiny_models_dir
from tests.http_server import FileServer, official_layout_files

DATA = "model.ckpt.data-00000-of-00001"
PROMPT = "I will go to the"  # reference_tiny.npz's cli_prompt
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, so no test can reach the internet by mistake
TIMEOUT_SECONDS = 60

# python -c RUN_MODULE <module> <args>: `python -m <module> <args>`, after PRELUDE has prepared the interpreter
RUN_MODULE = """
import runpy, sys
{prelude}
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
HIDE_FCNTL = """
import atexit
class NoFcntl:  # refuses fcntl, as Windows does, where the module does not exist
    def find_spec(self, name, path=None, target=None):
        if name == "fcntl":
            raise ModuleNotFoundError("No module named 'fcntl'", name=name)
sys.modules.pop("fcntl", None)
sys.meta_path.insert(0, NoFcntl())
atexit.register(lambda: print("fcntl loaded:", "fcntl" in sys.modules, file=sys.stderr))
"""
FAKE_MSVCRT = """
import atexit
import tests.fake_msvcrt as fake  # built on flock, so imported before fcntl is hidden
sys.modules["msvcrt"] = fake
atexit.register(lambda: print("msvcrt calls:", fake.calls, file=sys.stderr))
"""


def run_module(module, *args, prelude="", base_url=UNREACHABLE, unprivileged=False):  # -> CompletedProcess, as text
    """python -m module args; unprivileged: as a user whom file modes bind (see without_file_privileges)."""
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": base_url, "PYTHONPATH": str(REPO)}
    env.pop("GPT2_NUMPY_WEIGHTS", None)
    command = [sys.executable, "-c", RUN_MODULE.format(prelude=prelude), module, *args]
    command = without_file_privileges(command) if unprivileged else command
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=TIMEOUT_SECONDS)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def without_file_privileges(command):  # -> command, run so that file modes bind it as they bind any ordinary user
    if os.geteuid() != 0:
        return command
    # CI runs as root, whom file modes do not stop. Root without the two capabilities that override them is refused
    # like anyone else, and still reaches this interpreter (it may live under /root, 0700, where a user like nobody
    # could not start it). A chmod 000 folder then fails with a real EACCES from the kernel, not a mocked one.
    if not shutil.which("setpriv"):
        pytest.fail("setpriv (util-linux) is needed to run a command without root's file privileges")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", *command]


def error_lines(result):  # -> the "error: ..." lines of a CLI's stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def models_dir(tmp_path):  # -> a models dir whose 124M/ holds the tiny TF checkpoint and the official tokenizer
    return tiny_models_dir(tmp_path)


@pytest.fixture
def hf_greedy_text():  # -> Hugging Face's greedy continuation of PROMPT on the tiny weights, as text
    reference = np.load(FIXTURES / "reference_tiny.npz")
    tokenizer = load_tokenizer()
    assert tokenizer.encode(PROMPT) == reference["cli_prompt"].tolist()
    return tokenizer.decode(reference["cli_greedy_ids"])


@pytest.mark.slow
def test_a_damaged_checkpoint_placed_by_hand_gets_the_downloaders_error(models_dir):
    data = models_dir / "124M" / DATA
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01  # one bit of one weight
    data.write_bytes(damaged)
    generated = run_module("gpt2_numpy.generate", PROMPT, "--n-tokens", "5", "--models-dir", str(models_dir))
    downloaded = run_module("gpt2_numpy.download", "124M", "--models-dir", str(models_dir))
    assert generated.stdout == ""
    assert len(error_lines(generated)) == 1 and "fails its CRC32C check" in error_lines(generated)[0]
    assert generated.stderr.splitlines()[-1] == error_lines(generated)[0]
    assert error_lines(generated) == error_lines(downloaded)
    assert generated.returncode == downloaded.returncode == 2  # a bad file of the user's is bad input
    assert data.read_bytes() == damaged  # and it stays where the user put it


@pytest.mark.slow
def test_files_placed_by_hand_are_verified_on_first_use_only(models_dir, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", UNREACHABLE)
    checked = []  # names of the tensors whose CRC32C was checked
    real_read = TensorBundle.read

    def read(self, name, verify=False):
        checked.extend([name] if verify else [])
        return real_read(self, name, verify)

    monkeypatch.setattr(TensorBundle, "read", read)
    folder = models_dir / "124M"
    args = Namespace(model="124M", models_dir=str(models_dir), source="openai")
    model_from_args(args)
    assert sorted(checked) == sorted(TensorBundle(FIXTURES / "tf_tiny" / "model.ckpt").entries)  # each one, once
    stderr = capsys.readouterr().err
    assert f"verifying the files already in {folder}" in stderr and "once" in stderr
    assert json.loads((folder / MARKER).read_text()) == {
        path.name: [path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino]
        for path in folder.iterdir() if not path.name.startswith(".")
    }
    checked.clear()
    model_from_args(args)
    assert checked == []
    assert "verifying" not in capsys.readouterr().err
    with open(folder / "hparams.json", "a") as hparams:  # a file changed after it was verified: still valid JSON
        hparams.write(" ")
    model_from_args(args)
    assert sorted(checked) == sorted(TensorBundle(FIXTURES / "tf_tiny" / "model.ckpt").entries)  # verified again
    hparams_size = (folder / "hparams.json").stat().st_size
    assert json.loads((folder / MARKER).read_text())["hparams.json"][0] == hparams_size


@pytest.mark.slow
def test_a_model_on_disk_is_loaded_without_the_network_stack(models_dir):
    load = ("import sys; from argparse import Namespace; from gpt2_numpy.commands.common import model_from_args; "
            f"model_from_args(Namespace(model='124M', models_dir={str(models_dir)!r}, source='openai')); "
            "print(sorted(sys.modules.keys() & {'requests', 'urllib3', 'tqdm'}))")
    for use in ("first, verifying", "second, verified"):
        result = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, cwd=REPO,
                                env={**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE}, timeout=TIMEOUT_SECONDS)
        assert (result.returncode, result.stdout) == (0, "[]\n"), (use, result.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("msvcrt", [False, pytest.param(True, marks=pytest.mark.skipif(
    sys.platform == "win32", reason="Windows has the real msvcrt"))], ids=["no lock module", "msvcrt"])
def test_without_fcntl_a_download_and_a_generate_work(tmp_path, hf_greedy_text, msvcrt):
    prelude = (FAKE_MSVCRT if msvcrt else "") + HIDE_FCNTL
    models_dir = tmp_path / "models"
    with FileServer(official_layout_files()) as server:
        downloaded = run_module("gpt2_numpy.download", "124M", "--models-dir", str(models_dir), prelude=prelude,
                                base_url=server.url)
    assert downloaded.returncode == 0, downloaded.stderr
    (models_dir / "124M" / MARKER).unlink()  # so generate verifies again, under the lock
    generated = run_module("gpt2_numpy.generate", PROMPT, "--n-tokens", "20", "--models-dir", str(models_dir),
                           prelude=prelude)
    assert (generated.returncode, generated.stdout) == (0, hf_greedy_text + "\n"), generated.stderr
    for result in (downloaded, generated):
        assert "fcntl loaded: False" in result.stderr
        if msvcrt:  # the lock was taken and released on the Windows path: (LK_NBLCK, 1 byte) then (LK_UNLCK, 1 byte)
            assert "msvcrt calls: [(2, 1), (0, 1)]" in result.stderr


# --- Folders the user cannot read or write: real permission errors, from a process that file modes bind ---


@contextmanager
def mode(path, bits):  # path has mode bits inside the block, and its own mode again after it
    before = path.stat().st_mode & 0o7777
    path.chmod(bits)
    try:
        yield path
    finally:
        path.chmod(before)


def test_a_models_dir_that_cannot_be_read_is_one_error_line(models_dir):
    with mode(models_dir, 0o000):
        result = run_module("gpt2_numpy.generate", PROMPT, "--n-tokens", "5", "--models-dir", str(models_dir),
                            unprivileged=True)
    assert_one_error_line(result, f"cannot read {models_dir / '124M'} (Permission denied): fix the permissions")


def test_a_models_dir_that_cannot_be_written_is_one_error_line(tmp_path):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    with mode(models_dir, 0o555), FileServer(official_layout_files()) as server:
        result = run_module("gpt2_numpy.download", "124M", "--models-dir", str(models_dir), base_url=server.url,
                            unprivileged=True)
    assert (result.returncode, result.stdout) == (1, "")
    assert error_lines(result) == [f"error: cannot write {models_dir / '124M'}: Permission denied; fix its permissions "
                                   "or choose another folder with --models-dir or GPT2_NUMPY_WEIGHTS"]
    assert server.requests == [] and list(models_dir.iterdir()) == []


def test_a_weights_file_that_cannot_be_read_is_one_error_line_and_kept(models_dir):
    data = models_dir / "124M" / DATA
    with mode(data, 0o000):
        result = run_module("gpt2_numpy.generate", PROMPT, "--n-tokens", "5", "--models-dir", str(models_dir),
                            unprivileged=True)
    assert_one_error_line(result, f"{data} cannot be read (Permission denied)")
    assert f"left {DATA} in {models_dir / '124M'} untouched" in error_lines(result)[0]
    assert data.read_bytes() == (FIXTURES / "tf_tiny" / DATA).read_bytes()


def hf_models_dir(root):  # -> a models dir whose 124M-hf/ holds the tiny safetensors model and the real tokenizer
    folder = shutil.copytree(FIXTURES / "hf_tiny", root / "models" / "124M-hf")
    shutil.copy(official_path("124M/encoder.json"), folder / "vocab.json")
    shutil.copy(official_path("124M/vocab.bpe"), folder / "merges.txt")
    return folder.parent


@pytest.mark.slow
@pytest.mark.parametrize("source, suffix", [("openai", ""), ("huggingface", "-hf")])
def test_the_read_only_folder_hint_fills_that_very_folder(tmp_path, source, suffix):
    models_dir = tiny_models_dir(tmp_path) if source == "openai" else hf_models_dir(tmp_path)
    folder = models_dir / f"124M{suffix}"
    before = sorted(path.name for path in folder.iterdir())
    with mode(folder, 0o555):
        result = run_module("gpt2_numpy.download", "124M", "--source", source, "--models-dir", str(models_dir),
                            unprivileged=True)
    assert result.returncode == 0, result.stderr
    hint = next(line for line in result.stderr.splitlines() if "read-only" in line)
    command = hint.split("`")[1]
    models_dir_arg = shlex.quote(str(models_dir))
    assert command == f"python -m gpt2_numpy.download 124M --source {source} --models-dir {models_dir_arg}"
    assert sorted(path.name for path in folder.iterdir()) == before  # nothing written
    followed = run_module(*shlex.split(command)[2:])  # the hint, run with write access, records the verification
    assert followed.returncode == 0, followed.stderr
    assert (folder / MARKER).exists()


# --- What model_from_args says it loaded, and what generate refuses before loading anything ---


def test_a_folder_holding_another_shape_than_its_size_says_what_was_loaded(models_dir, capsys):
    shutil.copytree(models_dir / "124M", models_dir / "355M")
    model_from_args(Namespace(model="355M", models_dir=str(models_dir), source="openai"))
    line = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("loaded"))
    assert line.startswith("loaded a GPT-2 of n_vocab 512, n_ctx 64, n_embd 64, n_head 4, n_layer 2 (not the 355M "
                           f"that --model asked for) from {models_dir / '355M'}")


@pytest.mark.slow
@pytest.mark.parametrize("n_layer, n_head, words", [(1, 2, "1 layer, 32 wide, 2 heads"),
                                                    (2, 1, "2 layers, 32 wide, 1 head")])
def test_a_model_folder_says_its_shape_in_words(tmp_path, capsys, n_layer, n_head, words):
    hparams = {"n_vocab": 512, "n_ctx": 16, "n_embd": 32, "n_head": n_head, "n_layer": n_layer}
    save_model(tmp_path, hparams, random_params(hparams, 0), PACKAGED_VOCABULARY)
    cli.model_from_args(Namespace(model=tmp_path, models_dir=None, source="openai"))
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(f"loaded a GPT-2 of {words}, from {re.escape(str(tmp_path))} in [0-9]+\\.[0-9] s", line), line


def test_save_model_makes_a_missing_folder_and_its_parents(tmp_path):
    hparams = {"n_vocab": 512, "n_ctx": 16, "n_embd": 32, "n_head": 2, "n_layer": 1}
    params = random_params(hparams, 0)
    folder = tmp_path / "runs" / "first"
    save_model(folder, hparams, params, PACKAGED_VOCABULARY)
    loaded_hparams, loaded = load_params(folder)
    assert loaded_hparams == hparams
    expected, loaded = dict(flatten(params)), dict(flatten(loaded))
    assert loaded.keys() == expected.keys()
    for key, array in loaded.items():
        np.testing.assert_array_equal(array, expected[key], err_msg=str(key))
    assert load_tokenizer(folder).n_vocab == 50257


OFFICIAL_SHAPES = {  # OpenAI's published hparams.json of each size: (n_layer, n_embd, n_head); all n_ctx 1024
    "124M": (12, 768, 12), "355M": (24, 1024, 16), "774M": (36, 1280, 20), "1558M": (48, 1600, 25)}


@pytest.mark.parametrize("size", OFFICIAL_SHAPES)
def test_an_official_shape_is_named_by_its_size_and_only_there(size):
    n_layer, n_embd, n_head = OFFICIAL_SHAPES[size]
    hparams = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer}
    assert cli.loaded_name(size, hparams) == f"GPT-2 {size}"
    other = next(name for name in OFFICIAL_SHAPES if name != size)
    assert cli.loaded_name(other, hparams).startswith(f"a GPT-2 of GPT-2 {size}'s shape, n_vocab 50257")


@pytest.mark.slow
def test_more_new_tokens_than_any_official_context_are_refused_before_any_download(tmp_path):
    with FileServer(official_layout_files()) as server:
        refused = run_module("gpt2_numpy.generate", PROMPT, "--n-tokens", "1024", "--models-dir",
                             str(tmp_path / "models"), base_url=server.url)
        assert_one_error_line(refused, "1024 new tokens make 1025, more than the model's context of 1024 tokens")
        assert server.requests == []
        allowed = run_module("gpt2_numpy.generate", PROMPT, "--n-tokens", "1023", "--models-dir",
                             str(tmp_path / "models"), base_url=server.url)
    assert server.requests  # 1023 may fit an official model: it is downloaded, then the tiny one's 64 refuse it
    assert_one_error_line(allowed, "more than the model's context of 64 tokens")


def test_a_path_flag_reads_a_leading_tilde_as_home_as_models_dir_always_did(monkeypatch, tmp_path):
    # --out '~/x' (quoted: no shell expanded it) made a folder named "~" here, while --models-dir '~/x' meant home
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.path_argument("~/x") == tmp_path / "x"
    assert cli.path_argument("~") == tmp_path
    assert cli.path_argument("a/~/x") == cli.Path("a/~/x")  # only a leading ~ is the home folder, as in a shell
    monkeypatch.setenv("GPT2_NUMPY_WEIGHTS", "")
    args = cli.ArgumentParser(prog="t")
    cli.add_models_dir(args)
    assert args.parse_args(["--models-dir", "~/m"]).models_dir == tmp_path / "m"


def test_an_output_file_s_suffix_is_read_in_any_case(tmp_path):
    # FEATURES.HTML and PLOT.PNG are a page and a picture, as a browser and an image viewer take them
    assert cli.check_output_file(tmp_path / "FEATURES.HTML", "--html", cli.HTML_SUFFIXES) is None
    assert cli.check_output_file(tmp_path / "Page.Htm", "--html", cli.HTML_SUFFIXES) is None
    with pytest.raises(cli.UsageError, match=re.escape("must end in .html or .htm (got '.TXT')")):
        cli.check_output_file(tmp_path / "A.TXT", "--html", cli.HTML_SUFFIXES)
