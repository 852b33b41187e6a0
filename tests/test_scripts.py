"""The fixture scripts where their tools are missing: --help still works, and a run says in one line what to install
where, with no traceback."""
import subprocess
import sys

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
runpy.run_path(argv[0], run_name="__main__")
"""
TF_SCRIPT = REPO / "scripts" / "make_tf_fixture.py"
SAFETENSORS_SCRIPT = REPO / "scripts" / "make_safetensors_fixture.py"
CHECK_HF_SCRIPT = REPO / "scripts" / "check_train_hf.py"
HF_INSTALL = "pip install torch==2.13.0 transformers safetensors"


def run(script, *args, blocked=(), stubbed=(), cwd):  # -> CompletedProcess of the script under this Python
    command = [sys.executable, "-c", RUNNER, ",".join(blocked), ",".join(stubbed), str(script), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize(
    "script, blocked",
    [(TF_SCRIPT, ["numpy", "tensorflow", "regex"]), (SAFETENSORS_SCRIPT, ["numpy", "torch", "safetensors"]),
     (CHECK_HF_SCRIPT, ["numpy", "torch", "transformers"])],
)
def test_help_works_without_the_tools(script, blocked, tmp_path):
    result = run(script, "--help", blocked=blocked, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("usage: ")
    assert "venv" in result.stdout  # the help says where the tools live


@pytest.mark.parametrize(
    "script, blocked, stubbed, missing, install",
    [
        (TF_SCRIPT, ["tensorflow"], [], "tensorflow", "pip install tensorflow-cpu -e ."),
        # a TensorFlow venv where gpt2_numpy was installed with --no-deps
        (TF_SCRIPT, ["regex"], ["tensorflow"], "regex", "pip install tensorflow-cpu -e ."),
        (SAFETENSORS_SCRIPT, ["torch"], [], "torch", "pip install torch safetensors"),
        (SAFETENSORS_SCRIPT, ["safetensors"], ["torch"], "safetensors", "pip install torch safetensors"),
        (CHECK_HF_SCRIPT, ["torch"], [], "torch", HF_INSTALL),
        (CHECK_HF_SCRIPT, ["transformers"], ["torch"], "transformers", HF_INSTALL),
    ],
)
def test_a_missing_tool_is_one_line_saying_what_to_install_where(script, blocked, stubbed, missing, install, tmp_path):
    fixture = FIXTURES / "dtypes.safetensors"
    before = fixture.read_bytes()
    args = {TF_SCRIPT: ["--out", str(tmp_path / "out")],  # never the committed TF fixtures
            CHECK_HF_SCRIPT: [str(tmp_path)]}.get(script, [])
    result = run(script, *args, blocked=blocked, stubbed=stubbed, cwd=tmp_path)
    assert result.returncode == (2 if script == CHECK_HF_SCRIPT else 1) and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"{missing} is missing" in lines[0] and install in lines[0] and "venv" in lines[0]
    assert not (tmp_path / "out").exists() and fixture.read_bytes() == before  # nothing written
