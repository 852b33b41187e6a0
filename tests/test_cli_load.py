"""cli.load_model, the door every command line goes through: the folder it loads holds every file, verified.

Files placed by hand are verified on their first use and the verification is recorded (.verified.json), so a damaged
file is refused with the downloader's own error line instead of generating garbage, and later runs only compare sizes.
Expected error lines come from the download CLI run on the same folder; expected text is Hugging Face's greedy
continuation (tests/fixtures/reference_tiny.npz), as in tests/test_cli.py.
"""
import json
import os
import subprocess
import sys
from argparse import Namespace

import numpy as np
import pytest

from gpt2_numpy import weights
from gpt2_numpy.cli import load_model
from gpt2_numpy.formats.tf_bundle import TensorBundle
from gpt2_numpy.tokenizer import load_tokenizer
from tests.conftest import FIXTURES, REPO, tiny_models_dir
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


def run_module(module, *args, prelude="", base_url=UNREACHABLE):  # -> CompletedProcess of python -m module, as text
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": base_url, "PYTHONPATH": str(REPO)}
    env.pop("GPT2_NUMPY_WEIGHTS", None)
    command = [sys.executable, "-c", RUN_MODULE.format(prelude=prelude), module, *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=TIMEOUT_SECONDS)
    assert "Traceback" not in result.stderr, result.stderr
    return result


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


def test_files_placed_by_hand_are_verified_on_first_use_only(models_dir, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", UNREACHABLE)
    checked = []  # names of the tensors whose CRC32C was checked
    real_read = TensorBundle.read

    def read(self, name, verify=False):
        checked.extend([name] if verify else [])
        return real_read(self, name, verify)

    monkeypatch.setattr(TensorBundle, "read", read)
    folder = models_dir / "124M"
    args = Namespace(model_size="124M", models_dir=str(models_dir), source="openai")
    load_model(args)
    assert sorted(checked) == sorted(TensorBundle(FIXTURES / "tf_tiny" / "model.ckpt").entries)  # each one, once
    stderr = capsys.readouterr().err
    assert f"verifying the files already in {folder}" in stderr and "once" in stderr
    assert json.loads((folder / weights.MARKER).read_text()) == {
        path.name: path.stat().st_size for path in folder.iterdir() if not path.name.startswith(".")
    }
    checked.clear()
    load_model(args)
    assert checked == []
    assert "verifying" not in capsys.readouterr().err
    with open(folder / "hparams.json", "a") as hparams:  # a file changed after it was verified: still valid JSON
        hparams.write(" ")
    load_model(args)
    assert sorted(checked) == sorted(TensorBundle(FIXTURES / "tf_tiny" / "model.ckpt").entries)  # verified again
    assert json.loads((folder / weights.MARKER).read_text())["hparams.json"] == (folder / "hparams.json").stat().st_size


def test_a_model_on_disk_is_loaded_without_the_network_stack(models_dir):
    load = ("import sys; from argparse import Namespace; from gpt2_numpy.cli import load_model; "
            f"load_model(Namespace(model_size='124M', models_dir={str(models_dir)!r}, source='openai')); "
            "print(sorted(sys.modules.keys() & {'requests', 'urllib3', 'tqdm'}))")
    for use in ("first, verifying", "second, verified"):
        result = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, cwd=REPO,
                                env={**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE}, timeout=TIMEOUT_SECONDS)
        assert (result.returncode, result.stdout) == (0, "[]\n"), (use, result.stderr)


@pytest.mark.parametrize("msvcrt", [False, pytest.param(True, marks=pytest.mark.skipif(
    sys.platform == "win32", reason="Windows has the real msvcrt"))], ids=["no lock module", "msvcrt"])
def test_without_fcntl_a_download_and_a_generate_work(tmp_path, hf_greedy_text, msvcrt):
    prelude = (FAKE_MSVCRT if msvcrt else "") + HIDE_FCNTL
    models_dir = tmp_path / "models"
    with FileServer(official_layout_files()) as server:
        downloaded = run_module("gpt2_numpy.download", "124M", "--models-dir", str(models_dir), prelude=prelude,
                                base_url=server.url)
    assert downloaded.returncode == 0, downloaded.stderr
    (models_dir / "124M" / weights.MARKER).unlink()  # so generate verifies again, under the lock
    generated = run_module("gpt2_numpy.generate", PROMPT, "--n-tokens", "20", "--models-dir", str(models_dir),
                           prelude=prelude)
    assert (generated.returncode, generated.stdout) == (0, hf_greedy_text + "\n"), generated.stderr
    for result in (downloaded, generated):
        assert "fcntl loaded: False" in result.stderr
        if msvcrt:  # the lock was taken and released on the Windows path: (LK_NBLCK, 1 byte) then (LK_UNLCK, 1 byte)
            assert "msvcrt calls: [(2, 1), (0, 1)]" in result.stderr
