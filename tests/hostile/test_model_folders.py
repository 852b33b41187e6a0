"""Model folders from anyone (`--model DIR`): a hostile or odd file gives one error line naming it, at once, never a
hang, a traceback or a read without end. Each case runs the real command line in a subprocess under a time and an
address-space limit, so that a regression fails its test instead of hanging it or filling the machine's memory."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, REPO, UNREACHABLE, assert_one_error_line, official_path, tiny_models_dir

SECONDS = 30  # a command that refuses a folder takes about a second; the slack is for a loaded machine
ADDRESS_SPACE = 4 * 2**30  # bytes: a run needs well under 1 GB; reading /dev/zero whole would take all there is
HF_TOKENIZER = {"vocab.json": "124M/encoder.json", "merges.txt": "124M/vocab.bpe"}  # the same files, HF's names
OPENAI_TOKENIZER = {"encoder.json": "124M/encoder.json", "vocab.bpe": "124M/vocab.bpe"}
# python -c LIMITED_MODULE <bytes> <module> <args>: `python -m <module> <args>` in that much address space at most
# (set here, not in a preexec_fn, which is unsafe in a process with threads, as the test process has)
LIMITED_MODULE = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
module, sys.argv = sys.argv[2], sys.argv[2:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def tiny_folder(root, layout):  # -> a folder holding the tiny model in layout ("hf" or "tf") and GPT-2's tokenizer
    folder = shutil.copytree(FIXTURES / f"{layout}_tiny", root / "model")
    for name, official in (HF_TOKENIZER if layout == "hf" else OPENAI_TOKENIZER).items():
        shutil.copy(official_path(official), folder / name)
    return folder


def run(command, *args):  # -> CompletedProcess of `python -m gpt2_numpy.COMMAND args`, as text
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", LIMITED_MODULE, str(ADDRESS_SPACE), f"gpt2_numpy.{command}",
                             *map(str, args)], capture_output=True, text=True, cwd=REPO, env=env, timeout=SECONDS)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def to_dev_zero(path, _):
    path.symlink_to("/dev/zero")


def padded(path, original):  # the same JSON padded with spaces to a byte past 1 MB: valid, but past the limit
    path.write_bytes(original + b" " * (2**20 + 1 - len(original)))


CASES = {  # name: (layout, file, make(path, original bytes) after the file is removed, what the error line says)
    "deep JSON in vocab.json": ("hf", "vocab.json", lambda path, _: path.write_text("[" * 100_000),
                                "{path} is malformed: it is not valid JSON (it is nested too deeply)"),
    "config.json a symlink to /dev/zero": ("hf", "config.json", to_dev_zero,
                                           "{path} cannot be read (it is a device, not a regular file)"),
    "config.json a named pipe": ("hf", "config.json", lambda path, _: os.mkfifo(path),
                                 "{path} cannot be read (it is a named pipe, not a regular file)"),
    "config.json past 1 MB": ("hf", "config.json", padded, "{path} cannot be read (it is larger than 1 MB"),
    "vocab.json a named pipe": ("hf", "vocab.json", lambda path, _: os.mkfifo(path),
                                "cannot read {path} (it is a named pipe, not a regular file)"),
    "vocab.json a symlink to /dev/zero": ("hf", "vocab.json", to_dev_zero,
                                          "cannot read {path} (it is a device, not a regular file)"),
    "vocab.json a folder": ("hf", "vocab.json", lambda path, _: path.mkdir(),
                            "cannot read {path} (it is a folder, not a regular file)"),
    "model.safetensors a symlink to /dev/zero": ("hf", "model.safetensors", to_dev_zero,
                                                 "{path} cannot be read (it is a device, not a regular file)"),
    "model.safetensors a named pipe": ("hf", "model.safetensors", lambda path, _: os.mkfifo(path),
                                       "{path} cannot be read (it is a named pipe, not a regular file)"),
    "model.safetensors a folder": ("hf", "model.safetensors", lambda path, _: path.mkdir(),
                                   "{path} cannot be read (it is a folder, not a regular file)"),
    "model.ckpt.index a named pipe": ("tf", "model.ckpt.index", lambda path, _: os.mkfifo(path),
                                      "{path} cannot be read (it is a named pipe, not a regular file)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_hostile_file_is_one_error_line_naming_it(case, tmp_path):
    layout, name, make, expected = CASES[case]
    path = tiny_folder(tmp_path, layout) / name
    original = path.read_bytes()
    path.unlink()
    make(path, original)
    assert_one_error_line(run("generate", "--model", path.parent, "I will go to the", "--n-tokens", "2"),
                          expected.format(path=path))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["score", "explain"])
def test_deep_json_in_vocab_json_is_one_error_line_for_every_command(command, tmp_path):
    vocab = tiny_folder(tmp_path, "hf") / "vocab.json"
    vocab.write_text("[" * 100_000)
    assert_one_error_line(run(command, "--model", vocab.parent, "I will go to the"),
                          f"{vocab} is malformed: it is not valid JSON (it is nested too deeply)")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["hf", "tf"])  # either layout's files added to the other's folder
def test_a_folder_holding_both_layouts_is_refused_naming_both(layout, tmp_path):
    folder = tiny_folder(tmp_path, layout)
    for file in (FIXTURES / f"{'tf' if layout == 'hf' else 'hf'}_tiny").iterdir():
        shutil.copy(file, folder)
    result = run("generate", "--model", folder, "I will go to the", "--n-tokens", "2")
    assert_one_error_line(result, f"{folder} holds two models, OpenAI's (checkpoint, hparams.json, model.ckpt.index, "
                          "model.ckpt.data-00000-of-00001) and Hugging Face's (model.safetensors, config.json): move "
                          "one of them to a folder of its own")


@pytest.mark.slow
def test_a_config_json_of_exactly_the_limit_loads(tmp_path):  # the limit refuses only what is past it
    config = tiny_folder(tmp_path, "hf") / "config.json"
    text = json.dumps(json.loads(config.read_text()))
    config.write_text(text + " " * (2**20 - len(text)))
    result = run("generate", "--model", config.parent, "I will go to the", "--n-tokens", "2")
    assert result.returncode == 0 and result.stdout, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("make", [os.mkfifo, lambda path: path.write_text("[" * 100_000)],
                         ids=["named pipe", "deep JSON"])
def test_a_hostile_verification_record_is_verified_again(make, tmp_path):  # --models-dir's .verified.json
    models_dir = tiny_models_dir(tmp_path)
    make(models_dir / "124M" / ".verified.json")
    result = run("generate", "--models-dir", models_dir, "I will go to the", "--n-tokens", "2")
    assert result.returncode == 0 and result.stdout, result.stderr
    assert "verifying the files already in" in result.stderr
