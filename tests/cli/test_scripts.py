"""The fixture scripts where their tools are missing: --help still works, and a run says in one line what to install
where, with no traceback. The benchmark's --markdown: its tables between a page's markers, the rest of the page kept."""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO

# Runs a script with some modules made unimportable (None in sys.modules makes `import name` fail) and others replaced
# by empty stubs, so the outcome does not depend on what this Python has installed.
RUNNER = """
import runpy, sys, types
_, blocked, stubbed, *argv = sys.argv
sys.modules.update({name: None for name in blocked.split(",") if name})
sys.modules.update({name: types.ModuleType(name) for name in stubbed.split(",") if name})
sys.argv = argv
runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
"""
TF_SCRIPT = "scripts.fixtures.make_tf_fixture"
SAFETENSORS_SCRIPT = "scripts.fixtures.make_safetensors_fixture"
CHECK_HF_SCRIPT = "scripts.dev.check_train_hf"
HF_INSTALL = "pip install torch==2.13.0 transformers safetensors"
INTERVENE_SCRIPT = "scripts.fixtures.make_intervene_reference"
INDUCTION_HF_SCRIPT = "scripts.dev.induction_hf"


def run(script, *args, blocked=(), stubbed=(), cwd):  # -> CompletedProcess of `python -m script` under this Python
    command = [sys.executable, "-c", RUNNER, ",".join(blocked), ",".join(stubbed), script, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # as from the repo root


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, blocked",
    [(TF_SCRIPT, ["numpy", "tensorflow", "regex"]), (SAFETENSORS_SCRIPT, ["numpy", "torch", "safetensors"]),
     (CHECK_HF_SCRIPT, ["numpy", "torch", "transformers"]), (INDUCTION_HF_SCRIPT, ["numpy", "torch", "transformers"]),
     (INTERVENE_SCRIPT, ["numpy", "torch", "transformers", "transformer_lens"]),
     # these three once ignored their arguments: under the reference venv, --help rewrote the committed fixtures
     *((f"scripts.fixtures.{name}", ["numpy", "torch", "transformers"])
       for name in ("make_explain_reference", "make_heads_reference", "make_grad_reference", "make_config_options")),
     ("scripts.fixtures.make_hf_vocabulary", ["tokenizers"])],
)
def test_help_works_without_the_tools(script, blocked, tmp_path):
    result = run(script, "--help", blocked=blocked, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("usage: ")
    assert "venv" in result.stdout  # the help says where the tools live


@pytest.mark.parametrize("args, fragment", [
    (["--config", "nosuch"], "error: --config 'nosuch' is not in "),  # was a KeyError traceback
    (["--out", "precious"], "error: --out precious exists: pass a folder that does not exist yet"),  # was replaced
])
def test_the_tf_fixture_maker_checks_its_arguments_before_writing(args, fragment, tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "model.ckpt.index").write_text("a checkpoint of the user's")
    result = run(TF_SCRIPT, *args, blocked=["tensorflow"], cwd=tmp_path)  # the checks come before the tools' own
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(fragment) and result.stdout == ""
    assert (tmp_path / "precious" / "model.ckpt.index").read_text() == "a checkpoint of the user's"


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, blocked, stubbed, missing, install",
    [
        (TF_SCRIPT, ["tensorflow"], [], "tensorflow", "pip install tensorflow-cpu -e ."),
        # a venv with TensorFlow but without gpt2_numpy's own dependency (numpy: the script needs no other)
        (TF_SCRIPT, ["numpy"], ["tensorflow"], "numpy", "pip install tensorflow-cpu -e ."),
        (SAFETENSORS_SCRIPT, ["torch"], [], "torch", "pip install torch safetensors"),
        (SAFETENSORS_SCRIPT, ["safetensors"], ["torch"], "safetensors", "pip install torch safetensors"),
        (CHECK_HF_SCRIPT, ["torch"], [], "torch", HF_INSTALL),
        (CHECK_HF_SCRIPT, ["transformers"], ["torch"], "transformers", HF_INSTALL),
        (INDUCTION_HF_SCRIPT, ["transformers"], ["torch"], "transformers", HF_INSTALL),
        (INTERVENE_SCRIPT, ["transformer_lens"], ["torch", "transformers"], "transformer_lens",
         "pip install torch==2.13.0 transformer-lens transformers safetensors"),
    ],
)
def test_a_missing_tool_is_one_line_saying_what_to_install_where(script, blocked, stubbed, missing, install, tmp_path):
    fixture = FIXTURES / "dtypes.safetensors"
    before = fixture.read_bytes()
    args = {TF_SCRIPT: ["--out", str(tmp_path / "out")],  # never the committed TF fixtures
            CHECK_HF_SCRIPT: [str(tmp_path)], INDUCTION_HF_SCRIPT: [str(tmp_path / "text.txt")]}.get(script, [])
    result = run(script, *args, blocked=blocked, stubbed=stubbed, cwd=tmp_path)
    assert result.returncode == (2 if script == CHECK_HF_SCRIPT else 1) and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"{missing} is missing" in lines[0] and install in lines[0] and "venv" in lines[0]
    assert not (tmp_path / "out").exists() and fixture.read_bytes() == before  # nothing written


# --- the benchmark's page ---

PAGE_BEFORE, PAGE_AFTER = "# Performance\n\nMeasured with the benchmark.\n\n", "\n\nThe end of the page.\n"
PAGE = PAGE_BEFORE + "<!-- benchmark:begin -->\n| old | table |\n<!-- benchmark:end -->" + PAGE_AFTER


def benchmark(*args, cwd):  # -> CompletedProcess of `python -m scripts.benchmark` on the tiny TF checkpoint
    command = [sys.executable, "-m", "scripts.benchmark", "--checkpoint", str(FIXTURES / "tf_tiny"), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=100,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_markdown_puts_the_tables_between_the_markers_and_keeps_the_rest(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text(PAGE)
    result = benchmark("--only", "load", "CRC32C", "--repeats", "1", "--markdown", str(page), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tables = result.stdout.strip()
    assert "| load 124M, OpenAI TF checkpoint, without CRC (s) |" in tables and "| CRC32C (MB/s) |" in tables
    assert "Goals:" not in tables and "Where our time goes" not in tables  # no heading without rows under it
    assert page.read_text() == (PAGE_BEFORE + "<!-- benchmark:begin -->\n" + tables + "\n<!-- benchmark:end -->"
                                + PAGE_AFTER)


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["--repeats", "0", "--only", "einsum"], "--repeats 0: a median needs at least 1 run"),  # was a table of nan
    (["--only", "score"], "--only score measures nothing without --compare-hf"),  # was an empty table, status 0
    (["--only", "load", "--checkpoint", "no-such-folder"],
     "--only load measures nothing without --compare-hf or a TF checkpoint (--checkpoint)"),
    (["--only", "einsum", "BPE training", "--corpus", "no-such.txt"],  # was a child's traceback, after the other parts
     "--corpus no-such.txt: No such file or directory; the BPE training part trains on this UTF-8 text: pass another, "
     "or choose other parts with --only"),
    (["--only", "BPE training", "--corpus", "latin-1.txt"], "--corpus latin-1.txt: 'utf-8' codec can't decode byte "),
])
def test_a_benchmark_that_would_measure_nothing_is_one_error_line(args, fragment, tmp_path):
    (tmp_path / "latin-1.txt").write_bytes("Vous êtes".encode("latin-1"))
    result = benchmark(*args, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {fragment}"), result.stderr


def test_the_bpe_children_find_a_text_named_from_the_callers_folder(tmp_path, monkeypatch):  # they run in the repo
    import argparse

    from scripts.bench.bpe import run_child

    monkeypatch.chdir(tmp_path)
    (tmp_path / "small.txt").write_text("the cat sat on the mat, and the rat sat on the hat. " * 50)
    seconds, peak_mb = run_child(sys.executable, "ours", argparse.Namespace(data=Path("small.txt"), vocab_size=280))
    assert seconds > 0 and peak_mb > 0


@pytest.mark.slow
@pytest.mark.parametrize("text", [None, "# Performance\n\n<!-- benchmark:begin -->\nno end marker\n",
                                  "<!-- benchmark:end -->\nthe end before the beginning\n<!-- benchmark:begin -->\n"])
def test_markdown_without_its_markers_is_one_error_line_before_any_run(text, tmp_path):
    page = tmp_path / "performance.md"
    if text is not None:
        page.write_text(text)
    result = benchmark("--only", "CRC32C", "--markdown", str(page), cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(page) in lines[0], result.stderr
    assert ("cannot read" in lines[0]) if text is None else ("<!-- benchmark:begin -->" in lines[0])
    assert page.exists() == (text is not None) and (text is None or page.read_text() == text)  # nothing written


def test_benchmark_help_says_what_runs_without_a_checkpoint(tmp_path):
    result = benchmark("--help", cwd=tmp_path)
    assert result.returncode == 0 and "random weights" in " ".join(result.stdout.split())


@pytest.mark.slow
def test_the_bpe_benchmark_reports_the_childs_own_peak_memory(tmp_path):
    # a child forked from a large parent (the whole benchmark holds two models) must not report the parent's size
    import argparse

    import numpy as np

    from scripts.bench.bpe import run_child

    parent = np.ones(2**28, np.uint8)  # 256 MB, every page touched
    (tmp_path / "text.txt").write_text("the cat sat on the mat, and the rat sat on the hat. " * 200)
    seconds, peak_mb = run_child(sys.executable, "ours", argparse.Namespace(data=tmp_path / "text.txt", vocab_size=300))
    assert parent.all() and seconds > 0
    assert 10 < peak_mb < 200  # Python, NumPy and the trainer on a 10 KB text; the parent alone holds 256 MB more


# --- the mutants ---


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["--only", "nosuchpart"],  # was silence, status 0
     "--only 'nosuchpart' names no part: choose among attribution patching, backward, "),
    (["--only", "decode", "tests/no_such_test.py"], "pytest ran none of tests/no_such_test.py (status 4"),  # was
    # "NOT CAUGHT": pytest's own error read as a mutant no test caught
])
def test_a_mutant_run_that_would_test_nothing_is_one_error_line(args, fragment, tmp_path):
    result = subprocess.run([sys.executable, "-m", "scripts.dev.mutants", *args], capture_output=True, text=True,
                            cwd=REPO, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode != 0 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"error: {fragment}"), result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["scripts.demo.plot_loss", "no-such-log.csv", "out.png"], "error: cannot plot no-such-log.csv into out.png"),
    (["scripts.demo.plot_loss", "no-such-log.csv", "out"],
     "error: the picture out: the file name must end in .png or .svg (got no suffix)"),
    (["scripts.bench.tokenizer", "no-such-folder"], "error: no-such-folder is not a folder"),
    (["scripts.bench.tokenizer", "--baseline", "no-such.py"], "error: --baseline no-such.py is not a file"),
    (["scripts.dev.compare_models", "gpt2_numpy/model.py", "gpt2_numpy/fast.py"],  # model.py has no KV cache
     "has no new_cache and gpt2_cached: pass a version of gpt2_numpy/fast.py"),
    (["scripts.dev.compare_models", "gpt2_numpy/fast.py", "gpt2_numpy/fast.py", "--checkpoint", "no-such-folder"],
     "error: --checkpoint: no-such-folder holds no GPT-2 checkpoint"),
    (["scripts.dev.fuzz_formats", "--cases", "-5"], "argument --cases: must be at least 1, got -5"),
])
def test_a_script_given_a_bad_argument_says_so_in_one_line(args, fragment, tmp_path):  # each was a traceback or silence
    command = [sys.executable, "-m", *(str(REPO / arg) if arg.startswith("gpt2_numpy/") else arg for arg in args)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert fragment in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("script, theirs", [
    ("train_shakespeare.sh", "-init"),  # the second folder it makes, OUT-init
    ("compare_vocabularies.sh", ""),
    ("induction.sh", ""),
])
def test_a_demo_deletes_no_folder(script, theirs, tmp_path):  # each began with rm -rf of OUT
    users = tmp_path / f"out{theirs}"
    users.mkdir()
    (users / "train_state.npz").write_text("a run of the user's own")  # what the first fix still deleted
    # OUT from the caller's folder, not from the repo's; a session of its own, so that a script that went on to train
    # (the bug) is stopped whole at the time limit, its children too
    process = subprocess.Popen(["bash", str(REPO / "scripts" / "demo" / script), "out"], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: {users} exists: pass an OUT that does not exist yet\n"
    assert (users / "train_state.npz").read_text() == "a run of the user's own"


def run_induction_demo(tmp_path, *args):  # -> CompletedProcess of scripts/demo/induction.sh args, run from tmp_path
    # with this Python as its `python`
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(REPO / "scripts" / "demo" / "induction.sh"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=110)


@pytest.mark.parametrize("steps", ["x", "0", "-3", "1e3"])
def test_the_induction_demo_refuses_steps_that_are_not_a_count(tmp_path, steps):
    result = run_induction_demo(tmp_path, "out", steps)
    assert result.returncode == 2
    assert result.stderr == f"error: STEPS {steps} is not a whole number of steps above 0\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_induction_demo_trains_plots_scores_and_ablates_in_a_few_steps(tmp_path):
    result = run_induction_demo(tmp_path, "out", "2")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert {"model.safetensors", "log.csv", "heads.csv", "induction.png", "texts"} <= {p.name for p in out.iterdir()}
    assert (out / "texts" / "unseen.txt").read_text(encoding="utf-8") != ""
    with (out / "heads.csv").open() as file:
        steps = {line.split(",")[0] for line in list(file)[1:]}
    assert steps == {"0", "2"}  # the evaluations: step 0 and the last step
    # two steps form no head, and the script says so for each kind, naming the best, which it ablates all the same
    found = [line for line in result.stderr.splitlines() if "head formed" in line or line.startswith(
        ("induction head", "previous-token head"))]
    assert [line.split(":")[0] for line in found] == ["no induction head formed", "no previous-token head formed"]
    induction, previous = (line.split("the best, ")[1].split(",")[0] for line in found)
    assert induction.startswith("1.") and previous.startswith("0.")  # a layer-0 head feeds a layer-1 head
    assert "BPE merges" not in result.stderr  # --vocab-size 257 makes no merge: no bar counting "0merge"
    # then three ablations on the unseen text: each head alone, then both
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"zero-ablating {induction}", f"zero-ablating {previous}",
                                                     f"zero-ablating {induction} {previous}"]


@pytest.mark.slow
def test_the_induction_plot_takes_each_evaluations_best_head(tmp_path):
    from scripts.demo.plot_loss import best_scores

    heads = tmp_path / "heads.csv"
    heads.write_text("step,layer,head,previous_token,first_token,self,duplicate_token,induction\n"
                     "0,0,0,0.9,0,0,0,0.1\n0,1,0,0.2,0,0,0,0.3\n100,0,0,0.4,0,0,0,0.5\n100,1,0,0.6,0,0,0,0.2\n")
    assert best_scores(heads, "induction") == [(0, 0.3), (100, 0.5)]
    assert best_scores(heads, "previous_token") == [(0, 0.9), (100, 0.6)]
    log = tmp_path / "log.csv"
    log.write_text("step,train_loss,val_loss,tokens\n0,,5.5,0\n50,5.0,,64\n100,4.0,4.1,128\n")
    result = subprocess.run([sys.executable, "-m", "scripts.demo.plot_loss", str(log), str(tmp_path / "i.png"),
                             "--induction"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "i.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_loss_plot_that_cannot_be_written_leaves_the_old_picture(tmp_path):  # savefig wrote it in place
    import resource
    import signal

    def small_files():  # in the child: a file may not grow past 2 KB, and growing one fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    log = tmp_path / "log.csv"
    log.write_text("step,train_loss,val_loss,tokens\n" + "".join(f"{i},{5 - i / 9},{5 - i / 8},{64 * i}\n"
                                                                for i in range(1, 30)))
    picture = tmp_path / "loss.png"
    picture.write_bytes(b"the old picture")
    result = subprocess.run([sys.executable, "-m", "scripts.demo.plot_loss", str(log), str(picture)], cwd=REPO,
                            capture_output=True, text=True, timeout=60, preexec_fn=small_files,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2 and result.stderr.startswith(f"error: cannot plot {log} into {picture}")
    assert picture.read_bytes() == b"the old picture"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["log.csv", "loss.png"]  # no temporary left


def test_the_mutants_help_names_existing_tests_for_every_part():  # the table once covered a third of the parts
    result = subprocess.run([sys.executable, "-m", "scripts.dev.mutants", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    from scripts.dev.mutants import MUTANTS

    table = [line for line in result.stdout.splitlines() if line.startswith("    ") and "  tests/" in line]
    rows = [line.split("tests/", 1) for line in table]
    named = {part.strip('" ') for parts, _ in rows for part in parts.replace(" (default)", "").split(",")}
    assert named == {what.partition(":")[0] for what, *_ in MUTANTS}
    assert all((REPO / path).is_file() for _, files in rows for path in ("tests/" + files).split())


@pytest.mark.slow
def test_a_mutant_that_breaks_importing_counts_as_caught(tmp_path):  # pytest's status 2: a module that cannot load
    from scripts.dev.mutants import caught_by

    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "weights"))
    (copy / "gpt2_numpy" / "sampling.py").write_text("x = (\n")
    assert caught_by(copy, ["tests/unit/test_sampling.py"]) == ["tests/unit/test_sampling.py"]


def test_the_training_breakdown_times_every_part_it_names(monkeypatch):
    # each name in scripts/bench/train.py's TIMED must be a function a step calls through its module: a renamed or
    # no longer called one would break the benchmark's training part, or leave its row at 0
    from gpt2_numpy import fast
    from scripts.bench import train as bench

    monkeypatch.setattr(fast, "ALL_CORES_FROM", 1)  # the tiny step below runs as the benchmark's long ones do
    hparams = {"n_vocab": 50, "n_ctx": 16, "n_embd": 16, "n_head": 2, "n_layer": 1}
    step = bench.our_step(hparams, bench.random_params(hparams, seed=0), *bench.batch(hparams, (2, 8)))
    seconds = bench.our_parts(step)
    for names in bench.TIMED.values():
        for name in names:
            assert seconds.get(name, 0) > 0, name
