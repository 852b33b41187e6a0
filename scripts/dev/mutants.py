"""Plausible bugs in model.py, fast.py and cores.py, each applied alone to a copy of the repo: the tests that catch it.

    python -m scripts.dev.mutants [TEST_FILE ...]  (default: tests/test_model.py tests/test_fast.py tests/test_cores.py)

A test earns its place by failing when the code is wrong; a mutant that no test catches is a hole in the suite. Each
mutant replaces one line's text; the copy lives in a temporary folder, so the working tree is never touched.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUTANTS = [  # (what, file, text, replacement)
    ("model: scores / d, not / √d", "gpt2_numpy/model.py", "/ math.sqrt(q.shape[-1])", "/ q.shape[-1]"),
    ("model: softmax without the max shift", "gpt2_numpy/model.py",
     "np.exp(x - np.max(x, axis=-1, keepdims=True))", "np.exp(x)"),
    ("model: layer_norm eps 1e-3", "gpt2_numpy/model.py", "eps=1e-5):", "eps=1e-3):"),
    ("model: gelu 0.04 for 0.044715", "gpt2_numpy/model.py", "(x + 0.044715 * x**3)", "(x + 0.04 * x**3)"),
    ("model: the mask hides the diagonal", "gpt2_numpy/model.py", "dtype=np.float32), k=1)", "dtype=np.float32), k=0)"),
    ("model: merge_heads without the swap", "gpt2_numpy/model.py", "    x = np.swapaxes(x, -3, -2)\n", ""),
    ("fast: no division by the row sums", "gpt2_numpy/fast.py", "    out /= weights.sum(axis=-1, keepdims=True)\n", ""),
    ("fast: the scores transposed", "gpt2_numpy/fast.py", 'einsum("...kd,...qd->...qk"', 'einsum("...kd,...qd->...kq"'),
    ("fast: gelu constant 0.04", "gpt2_numpy/fast.py", "-2 * GELU_SCALE * 0.044715)", "-2 * GELU_SCALE * 0.04)"),
    ("fast: a query block sees one key too few", "gpt2_numpy/fast.py", "seen = n_k - n_q + end",
     "seen = n_k - n_q + end - 1"),
    ("fast: padding positions off by one", "gpt2_numpy/fast.py", "np.arange(n_past, n_past + n_seq) - pad[:, None], 0)",
     "np.arange(n_past, n_past + n_seq) - pad[:, None] + 1, 0)"),
    ("fast: each piece of the lm head one token short", "gpt2_numpy/fast.py",
     "chunk = slice(start, start + VOCAB_CHUNK)", "chunk = slice(start, start + VOCAB_CHUNK - 1)"),
    ("fast: each thread adds the first columns' bias", "gpt2_numpy/fast.py", "y[:, piece] += b[piece]",
     "y[:, piece] += b[: piece.stop - piece.start]"),
    ("fast: the pieces of attention cut along the queries", "gpt2_numpy/fast.py", "h = (..., piece, ALL, ALL)",
     "h = (..., piece, ALL)"),
    ("cores: the last piece one item short", "gpt2_numpy/cores.py",
     "bounds = [n_items * i // n_threads for i in range(n_threads + 1)]",
     "bounds = [n_items * i // n_threads for i in range(n_threads)] + [n_items - 1]"),
    ("cores: OpenBLAS keeps its threads during a pass", "gpt2_numpy/cores.py", "                blas[0](1)\n", ""),
    ("cores: OpenBLAS's threads not restored", "gpt2_numpy/cores.py",
     'blas[0](passes["n_threads"])', "pass"),
    ("cores: a forked child keeps its parent's pool", "gpt2_numpy/cores.py",
     "os.register_at_fork(after_in_child=helpers.cache_clear)\n", ""),
]


def caught_by(copy, tests):  # -> ids of the failing tests
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *tests], cwd=copy,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(copy)})
    return [line.split(" - ")[0].removeprefix("FAILED ") for line in result.stdout.splitlines()
            if line.startswith("FAILED")]


def main(tests):
    tests = tests or ["tests/test_model.py", "tests/test_fast.py", "tests/test_cores.py"]
    with tempfile.TemporaryDirectory() as scratch:
        for what, path, text, replacement in MUTANTS:
            copy = Path(scratch) / "repo"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "weights"))
            source = (copy / path).read_text()
            if text not in source:  # the code moved on: the mutant needs updating, not a traceback
                sys.exit(f"error: mutant {what!r}: {text!r} is no longer in {path}; update MUTANTS in {__file__}")
            (copy / path).write_text(source.replace(text, replacement, 1))
            failed = caught_by(copy, tests)
            print(f"{what}: " + (f"caught by {len(failed)}: " + ", ".join(failed) if failed else "NOT CAUGHT"),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
