"""The command lines as a whole: one `gpt2-numpy COMMAND` entry, every `python -m gpt2_numpy.X` of before still
working, the flags that agree across commands, and the library below them free of argparse and of the commands."""
import ast
import json
import os
import subprocess
import sys
import types
from argparse import Namespace

import pytest

from gpt2_numpy.commands import COMMANDS
from gpt2_numpy.commands import main as commands_main
from gpt2_numpy.errors import UsageError
from gpt2_numpy.commands.common import model_from_args, model_choice
from gpt2_numpy.params import random_params
from gpt2_numpy.save import save_model
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY
from tests.conftest import REPO, UNREACHABLE, assert_one_error_line, tiny_models_dir

PACKAGE = REPO / "gpt2_numpy"
# the flags each command's --help must list: its own, and those that agree across commands
FLAGS = {
    "generate": ["PROMPT", "--n-tokens", "--model", "--models-dir", "--source", "--temperature", "--batch-size",
                 "--json"],
    "score": ["TEXT", "--data", "--stride", "--per-token", "--json", "--model", "--models-dir"],
    "explain": ["PROMPT", "--layer", "--head", "--lens", "--html", "--json", "--model", "--models-dir"],
    "train": ["--data", "--out", "--init", "--resume", "--steps", "--batch-size", "--models-dir", "--vocab-size"],
    "tokenizer": ["--data", "--vocab-size", "--out", "--min-frequency", "--json"],
    "download": ["MODEL", "--model", "--models-dir", "--source", "--json"],
    "sae": ["train", "eval", "features"],
    "circuits": ["graph"],
}


def run(*args, env=()):  # -> CompletedProcess of `python *args` from the repo, offline, with str output
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPT2_NUMPY_BASE_URL": UNREACHABLE, **dict(env)}
    env.pop("GPT2_NUMPY_WEIGHTS", None)
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_every_command_is_in_the_table():
    assert list(FLAGS) == list(COMMANDS)


# python -m gpt2_numpy.X before the one entry (tokenizer and circuits came after it; sae is a package of the library
# now, run as python -m gpt2_numpy sae: a __main__.py inside it would import the commands from below them)
OLD_MODULES = [command for command in FLAGS if command not in ("tokenizer", "circuits", "sae")]


@pytest.mark.slow
@pytest.mark.parametrize("module, command", [
    *((f"gpt2_numpy.{command}", command) for command in OLD_MODULES),  # library modules, each with a shim
    *((f"gpt2_numpy.commands.{command}", command) for command in FLAGS),
])
def test_python_m_of_each_module_named_like_a_command_runs_that_command(module, command):
    result = run("-m", module, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith(f"usage: gpt2-numpy {command} ")
    assert [flag for flag in FLAGS[command] if flag not in result.stdout] == []


def test_python_m_of_the_tokenizer_library_names_the_tokenizer_command():
    # the command imports gpt2_numpy.tokenizer, so a shim there would close a circle; the package must not import it
    # first either (runpy would print a warning before the error line)
    assert_one_error_line(run("-m", "gpt2_numpy.tokenizer", "--data", "x"),
                          "gpt2_numpy.tokenizer is the tokenizer's library; its command line is python -m gpt2_numpy "
                          "tokenizer (or gpt2-numpy tokenizer)")


@pytest.mark.slow
@pytest.mark.parametrize("command", FLAGS)
def test_each_command_of_the_one_entry_lists_its_flags(command):
    result = run("-m", "gpt2_numpy", command, "--help")
    assert result.returncode == 0, result.stderr
    assert [flag for flag in FLAGS[command] if flag not in result.stdout] == []
    assert result.stdout == run("-m", f"gpt2_numpy.commands.{command}", "--help").stdout  # the same either way


def test_the_one_entry_lists_every_command_with_one_line():
    result = run("-m", "gpt2_numpy", "--help")
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("\ncommands:\n")[1].split("\n\n")[0]
    listed = {line.split()[0]: line for line in section.splitlines()}
    assert list(listed) == list(COMMANDS)
    assert all(COMMANDS[name] in line for name, line in listed.items())


@pytest.mark.slow
@pytest.mark.parametrize("argv, fragment", [
    ([], "no command given: choose one of generate, score, explain, train, tokenizer, download, sae"),
    (["scroe", "text"], "unknown command 'scroe' (did you mean score?): choose one of generate, score, explain, "
                        "train, tokenizer, download, sae, circuits; to continue the one-word prompt 'scroe', run "
                        "gpt2-numpy generate scroe"),
    # else the prompts "score" and "hi" would be continued, with no word on the command meant
    (["--threads", "1", "score", "hi"], "the command goes first, its flags after it: gpt2-numpy score [flags]; to "
                                        "continue the one-word prompt 'score', run gpt2-numpy generate [flags] score"),
])
def test_a_missing_or_misspelt_command_is_one_line_naming_the_commands(argv, fragment):
    assert_one_error_line(run("-m", "gpt2_numpy", *argv), fragment)


@pytest.mark.slow
@pytest.mark.parametrize("argv, same_as", [(["help"], ["--help"]), (["help", "score"], ["score", "--help"])])
def test_help_is_no_prompt_but_the_help(argv, same_as):  # as `git help` and `pip help` are: not a download of 124M
    result = run("-m", "gpt2_numpy", *argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == run("-m", "gpt2_numpy", *same_as).stdout


def test_help_for_an_unknown_command_says_so():  # not the general help and status 0, as if it had been understood
    assert_one_error_line(run("-m", "gpt2_numpy", "help", "gnerate"),
                          "help: unknown command 'gnerate' (did you mean generate?): choose one of generate, score")


def test_the_help_lists_every_sae_command():  # sae features was missing
    from gpt2_numpy.commands import help_text

    assert all(f"sae {name}" in help_text() for name in ("train", "eval", "features"))


def test_generate_s_usage_says_a_prompt_is_required():
    assert "PROMPT [PROMPT ...]" in run("-m", "gpt2_numpy", "generate", "--help").stdout


def test_model_and_its_old_name_together_are_one_error_line(tmp_path):  # else the last one given wins, unsaid
    result = run("-m", "gpt2_numpy", "score", "hi", "--model", str(tmp_path), "--model-size", "355M")
    assert_one_error_line(result, "argument --model-size: not allowed with argument --model")


@pytest.mark.slow
@pytest.mark.parametrize("argv, flag", [
    (["generate", "hi", "--model", ""], "--model"),
    (["score", "hi", "--models-dir", ""], "--models-dir"),
    (["score", "--data", ""], "--data"),
    (["explain", "hi", "--html", ""], "--html"),
    (["train", "--data", "x.txt", "--out", ""], "--out"),
    (["train", "--data", "x.txt", "--out", "run", "--init", ""], "--init/--model"),
    (["tokenizer", "--data", "", "--vocab-size", "300", "--out", "tok"], "--data"),
])
def test_an_empty_path_is_refused_by_its_flag(argv, flag):  # Path("") is ".": the current folder, taken silently
    assert_one_error_line(run("-m", "gpt2_numpy", *argv), f"argument {flag}: is empty: name a file or folder")


@pytest.mark.slow
def test_a_first_argument_that_names_no_command_is_a_prompt(tmp_path):
    # as before the commands: `python -m gpt2_numpy PROMPT` generates (here refused for the prompt's length)
    models_dir = tiny_models_dir(tmp_path)
    result = run("-m", "gpt2_numpy", "I will go to the", "--n-tokens", "60", "--models-dir", str(models_dir))
    assert_one_error_line(result, "the prompt's 5 tokens plus 60 new tokens make 65")


def test_after_a_double_dash_a_command_s_name_is_a_prompt(tmp_path, monkeypatch, capsys):
    # the way to continue the one-word prompt "score": generate takes it (and the tiny 124M's 512 ids refuse
    # tiktoken's id of it, 26675)
    monkeypatch.setenv("GPT2_NUMPY_WEIGHTS", str(tiny_models_dir(tmp_path)))
    with pytest.raises(SystemExit) as exit_status:
        commands_main(["--", "score"])
    assert exit_status.value.code == 2
    assert "error: the prompt's token 26675 ('score', position 0) is outside" in capsys.readouterr().err


def library_modules():  # -> every module of the package but the commands, as paths
    return [path for path in PACKAGE.rglob("*.py") if "commands" not in path.relative_to(PACKAGE).parts]


def imported_names(tree):  # -> names of the modules imported by a module's top level, outside its __main__ block
    names = []
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            continue  # a shim runs its command there, and only when it is the program
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                names += [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom):
                names.append(inner.module or "")
    return names


def test_no_library_module_imports_argparse_or_the_commands():
    offenders = {}
    for path in library_modules():
        if path.name == "__main__.py":  # the program itself: `python -m gpt2_numpy[.explain]`
            continue
        names = imported_names(ast.parse(path.read_text()))
        bad = [name for name in names if name == "argparse" or name.startswith("gpt2_numpy.commands")]
        if bad:
            offenders[str(path.relative_to(REPO))] = bad
    assert offenders == {}
    assert len(library_modules()) > 20  # the walk found the package


def test_the_entry_points_keep_the_import_paths_that_0_1_0_documented():
    import gpt2_numpy.generate
    import gpt2_numpy.score
    from gpt2_numpy import decode, explain, fast_backward, interpret, likelihood, train
    from gpt2_numpy.generate import generate, generate_batch

    assert (generate, generate_batch) == (decode.generate, decode.generate_batch)
    assert (explain.walkthrough, explain.head_scores) == (interpret.walkthrough, interpret.head_scores)
    assert train.loss_and_grads is fast_backward.loss_and_grads
    assert gpt2_numpy.score.token_log_probs is likelihood.token_log_probs
    assert type(gpt2_numpy.generate) is types.ModuleType  # a plain module: nothing makes it callable


# --- --model names a size or a folder, everywhere ---


@pytest.fixture
def models_dir(tmp_path):
    return tiny_models_dir(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--model", "--model-size"])  # --model-size: the old name
def test_model_as_a_size_loads_that_size_from_the_models_dir(models_dir, flag):
    result = run("-m", "gpt2_numpy", "score", "I will go to the", "--no-bos", flag, "124M", "--models-dir",
                 str(models_dir), "--json")
    assert result.returncode == 0, result.stderr
    assert f"from {models_dir / '124M'}" in result.stderr
    assert json.loads(result.stdout)["n_tokens"] == 4


def test_model_as_a_folder_loads_that_folder(tmp_path, monkeypatch, capsys):
    hparams = {"n_vocab": 50257, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 1}
    folder = tmp_path / "124M"  # a folder named like a size is a folder when written as a path
    save_model(folder, hparams, random_params(hparams, 0), PACKAGED_VOCABULARY)
    monkeypatch.chdir(tmp_path)
    loaded, _, _ = model_from_args(Namespace(model=model_choice("./124M"), models_dir=None, source="openai"))
    assert loaded == hparams
    assert "loaded a GPT-2 of 1 layer, 8 wide, 2 heads, from 124M" in capsys.readouterr().err


def test_model_that_is_neither_a_size_nor_a_folder_is_one_error_line(tmp_path):
    result = run("-m", "gpt2_numpy", "generate", "hi", "--model", str(tmp_path / "124"))
    assert_one_error_line(result, f"--model {tmp_path / '124'} does not exist: pass a model folder")
    assert "or an official size (124M, 355M, 774M, 1558M)" in result.stderr


# --- Hints: each where it applies, and only there ---

DASH_HINT = "goes last, after '--'"


@pytest.mark.slow
@pytest.mark.parametrize("argv, message, absent", [
    (["generate", "--tokens", "20", "x"], "unrecognized arguments: --tokens; did you mean --n-tokens instead of "
     "--tokens?", [DASH_HINT]),
    (["generate", "x", "--temp=0.8"], "unrecognized arguments: --temp=0.8; did you mean --temperature instead of "
     "--temp?", [DASH_HINT]),
    (["generate", "--model", "my-gpt"], 'no prompt given: gpt2-numpy generate needs one, e.g. gpt2-numpy generate '
     '"The cat" (see --help)', [DASH_HINT, "did you mean"]),
    (["generate", "--model", "my-gpt", "-hello"], "unrecognized arguments: -hello; a prompt that begins with '-' goes "
     "last, after '--': gpt2-numpy generate --n-tokens 5 -- \"-x\" (see --help)", ["ignored explicit", "did you mean"]),
    (["explain", "-x"], "no prompt given: gpt2-numpy explain needs one, e.g. gpt2-numpy explain \"The cat\"; a prompt "
     "that begins with '-' goes last, after '--'", ["did you mean"]),
    (["explain", "--layer", "-1"], "no prompt given: gpt2-numpy explain needs one", [DASH_HINT]),  # -1 is a value
    (["explain", "hi", "--lenss"], "unrecognized arguments: --lenss; did you mean --lens instead of --lenss?",
     [DASH_HINT]),
    (["score", "-hello"], "unrecognized arguments: -hello; a text that begins with '-' goes last", ["did you mean"]),
    (["score", "-h ello"], "unrecognized arguments: -h ello; a text that begins with '-' goes last", []),  # "-h" a flag
    (["train", "--data", "x", "--out", "y", "--step", "3"], "unrecognized arguments: --step 3; did you mean --steps "
     "instead of --step?", []),
    (["tokenizer", "--data", "x", "--vocab-size", "300", "--outt", "y"], "the following arguments are required: "
     "--out; did you mean --out instead of --outt?", []),
    (["download", "124M", "--modles-dir", "w"], "did you mean --models-dir instead of --modles-dir?", []),
    (["generate", "--colour", "x"], "unrecognized arguments: --colour (see --help)", [DASH_HINT, "did you mean"]),
])
def test_a_usage_error_gets_the_hints_that_apply_to_it_and_no_other(argv, message, absent):
    result = run("-m", "gpt2_numpy", *argv)
    assert_one_error_line(result, message)
    assert [text for text in absent if text in result.stderr] == []


@pytest.mark.parametrize("argv, hinted", [
    (["-", "--stride"], False),  # "-" reads the text from stdin: it is no text that begins with '-'
    (["-", "--tokens", "3"], False),
    (["-", "-x"], True),  # "-x" is
    (["--per-token", "-x"], True),
])
def test_stdin_s_dash_gets_no_dash_hint_and_text_beside_it_does(argv, hinted):
    from gpt2_numpy.commands import score

    with pytest.raises(UsageError) as caught:
        score.parse_args(argv)
    assert (DASH_HINT in str(caught.value)) == hinted, str(caught.value)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["score", "I will go to the", "--model", "124m"],
                                  ["score", "I will go to the", "--model-size", "124m"]])
def test_a_size_in_the_wrong_case_is_that_size(models_dir, argv):
    result = run("-m", "gpt2_numpy", *argv, "--no-bos", "--models-dir", str(models_dir), "--json")
    assert result.returncode == 0, result.stderr
    assert f"from {models_dir / '124M'}" in result.stderr


def test_download_and_train_take_a_size_in_the_wrong_case():
    from gpt2_numpy.commands import download, train

    assert download.parse_args(["355m"]).size == download.parse_args(["--model", "355m"]).size == "355M"
    assert train.parse_args(["--data", "x", "--out", "y", "--init", "1558m"]).init == "1558M"
