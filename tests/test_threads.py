"""The thread count (cores.threads: --threads, $GPT2_NUMPY_THREADS, the CPU affinity) and every split of a pass at team
sizes 1, 2, 3 and 16, which may oversubscribe the machine: each equals the pass on one thread. No timing is asserted."""
import os
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy import cores, fast
from gpt2_numpy.commands import score
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES, REPO, missing

HPARAMS = {"n_vocab": 97, "n_ctx": 48, "n_embd": 48, "n_head": 6, "n_layer": 2}
TEAMS = [1, 2, 3, 16]


@pytest.fixture
def openblas():  # -> OpenBLAS's (set_num_threads, get_num_threads); the count and the setting restored after the test
    blas = cores.openblas()
    if blas is None:  # CI's machine has NumPy's own OpenBLAS
        missing("no OpenBLAS found in this process: nothing for the thread count to set")
    before, setting = blas[1](), cores.settings["threads"]
    yield blas
    blas[0](before)
    cores.settings["threads"] = setting


def in_a_team(monkeypatch, size):  # -> list of the pieces of each split; every split from now shares its pieces
    monkeypatch.setattr(cores, "MIN_WORK", 1)  # no piece too small to hand over: the tiny model splits as the 124M
    monkeypatch.setattr(cores.team, "size", size, raising=False)  # as within cores.all_cores() with size threads
    splits, split = [], cores.split

    def recorded(work, n_items, item_size=1):
        pieces = []
        splits.append(pieces)

        def piece(share):
            pieces.append(share)  # list.append holds the GIL: safe from every thread
            work(share)
        split(piece, n_items, item_size)

    monkeypatch.setattr(cores, "split", recorded)
    return splits


@pytest.mark.parametrize("size", TEAMS)
def test_each_split_pass_in_a_team_equals_one_thread(size, monkeypatch):
    rng = np.random.default_rng(size)
    x, h = rng.standard_normal((2, 20, 48), dtype=np.float32), rng.standard_normal((400, 192), dtype=np.float32)
    w, b, g = rng.standard_normal((48, 144), dtype=np.float32), *rng.standard_normal((2, 144), dtype=np.float32)
    q, k, v = rng.standard_normal((3, 6, 40, 8), dtype=np.float32)
    mask = fast.offset_causal_mask(40, 40)
    with cores.one_core():
        alone = [fast.layer_norm(x, g[:48], b[:48]), fast.linear(x, w, b), fast.gelu(h),
                 fast.causal_attention(q, k, v, mask)]
    splits = in_a_team(monkeypatch, size)
    shared = [fast.layer_norm(x, g[:48], b[:48]), fast.linear(x, w, b), fast.gelu(h),
              fast.causal_attention(q, k, v, mask)]
    heads = [min(size, 6)] if size > 1 else []  # a team of one runs attention's heads without a split
    assert [len(pieces) for pieces in splits] == [min(size, 40), size, min(size, 3), *heads]  # 40 rows, 144 columns,
    # gelu's 76,800 elements in 3 chunks of CHUNK, 6 heads: a piece per thread of the team, at most
    np.testing.assert_array_equal(shared[0], alone[0])  # row by row, the same operations on each row
    np.testing.assert_array_equal(shared[2], alone[2])  # elementwise
    for got, expected in zip(shared[1::2], alone[1::2]):  # products of other shapes may sum in another order
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("size", TEAMS)
def test_a_whole_pass_in_a_team_equals_one_thread(size, monkeypatch):
    params = random_params(HPARAMS, seed=7)
    ids = np.random.default_rng(2).integers(0, HPARAMS["n_vocab"], (2, 20))
    with cores.one_core():
        alone = fast.gpt2(ids, **params, n_head=HPARAMS["n_head"])
    splits = in_a_team(monkeypatch, size)
    shared = fast.gpt2(ids, **params, n_head=HPARAMS["n_head"])
    assert max(len(pieces) for pieces in splits) == size  # linear's columns outnumber any team here
    assert np.abs(shared - alone).max() <= 1e-5 * np.abs(alone).max()


@pytest.mark.parametrize("size, item_size, n_threads", [
    (16, 1 << 15, 3),  # 12 items of 2^15: three threads' worth of MIN_WORK (2^17)
    (16, 1 << 16, 6),
    (3, 1 << 16, 3),  # the team is the bound
    (16, 1 << 20, 12),  # the items are
    (16, 1, 1),  # too little work for a second thread
])
def test_a_split_gives_each_thread_min_work_at_least(size, item_size, n_threads, monkeypatch):
    monkeypatch.setattr(cores.team, "size", size, raising=False)
    monkeypatch.setattr(cores, "MIN_WORK", 1 << 17)
    pieces = []
    cores.split(pieces.append, 12, item_size)
    assert len(pieces) == n_threads
    assert sorted((p.start, p.stop) for p in pieces)[-1][1] == 12


def test_set_threads_sets_openblas_outside_a_pass_and_the_team_within(openblas):
    assert cores.set_threads(3) == 3 and cores.threads() == 3
    assert openblas[1]() == 3  # a decode step's products, the lm head and training run 3 threads
    with cores.all_cores():
        assert (openblas[1](), cores.team_size()) == (1, 3)  # within a long pass: ours, never both
    assert openblas[1]() == 3
    cores.set_threads(1)
    with cores.all_cores():
        assert (openblas[1](), cores.team_size()) == (1, 1)


def test_set_threads_during_a_pass_takes_effect_when_it_ends(openblas):
    cores.set_threads(2)
    with cores.all_cores():
        cores.set_threads(3)
        assert openblas[1]() == 1  # the pass keeps OpenBLAS on one thread
    assert openblas[1]() == 3


THREADS_IN_A_CHILD = """
import os, sys
if sys.argv[1] == "one core":
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
from gpt2_numpy import cores
print(cores.threads(), cores.openblas()[1]())
"""


@pytest.mark.parametrize("variable, affinity, expected, blas", [
    ("1", "all", "1 1", {}), ("5", "all", "5 5", {}), (None, "one core", "1 1", {}), (None, "all", None, {}),
    ("3", "all", "3 3", {"OPENBLAS_NUM_THREADS": "1"}),  # ours over the BLAS's
    (None, "all", "1 1", {"OPENBLAS_NUM_THREADS": "1"}), (None, "all", "1 1", {"OMP_NUM_THREADS": "1"}),
    (None, "all", "1 1", {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "3"}),  # OpenBLAS's order
    (None, "all", None, {"OPENBLAS_NUM_THREADS": "x"})])
def test_the_count_comes_from_the_variable_else_the_blas_s_else_the_cpu_affinity(variable, affinity, expected, blas,
                                                                                 openblas):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this system")
    env = {key: value for key, value in os.environ.items()
           if key not in (cores.THREADS_VARIABLE, *cores.BLAS_VARIABLES)}
    env.update({"PYTHONPATH": str(REPO), **({cores.THREADS_VARIABLE: variable} if variable else {}), **blas})
    result = subprocess.run([sys.executable, "-c", THREADS_IN_A_CHILD, affinity], capture_output=True, text=True,
                            timeout=60, env=env)
    every_core = len(os.sched_getaffinity(0))
    assert result.stdout.split() == (expected or f"{every_core} {every_core}").split(), result.stderr


def test_the_help_names_every_variable_the_count_comes_from():  # OMP_NUM_THREADS counts too, so the help says it
    help_text = " ".join(run_score("--help").stdout.split())
    assert all(f"${name}" in help_text for name in (cores.THREADS_VARIABLE, *cores.BLAS_VARIABLES)), help_text


def run_score(*args, env=None):  # -> CompletedProcess of `python -m gpt2_numpy score ...` on the tiny checkpoint
    command = [sys.executable, "-m", "gpt2_numpy", "score", "hello", "--model", str(FIXTURES / "tf_tiny"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


@pytest.mark.parametrize("args, env, fragment", [
    (["--threads", "0"], None, "argument --threads: must be at least 1, got 0"),
    (["--threads", "two"], None, "argument --threads: invalid whole number value: 'two'"),
    ([], {cores.THREADS_VARIABLE: "0"}, "GPT2_NUMPY_THREADS=0 is not a whole number of threads >= 1"),
    ([], {cores.THREADS_VARIABLE: "many"}, "GPT2_NUMPY_THREADS=many is not a whole number of threads >= 1"),
])
def test_a_bad_thread_count_is_one_error_line(args, env, fragment):
    result = run_score(*args, env=env)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {fragment}"), result.stderr


def test_the_threads_flag_sets_the_count_over_the_variable(openblas, monkeypatch):
    monkeypatch.setenv(cores.THREADS_VARIABLE, "5")
    score.parse_args(["hello", "--threads", "3"])
    assert cores.threads() == 3 and openblas[1]() == 3


def benchmark(*args):  # -> CompletedProcess of `python -m scripts.benchmark` on the tiny TF checkpoint
    command = [sys.executable, "-m", "scripts.benchmark", "--checkpoint", str(FIXTURES / "tf_tiny"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=100, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_benchmark_runs_each_part_at_each_count_in_a_column_and_notes_oversubscription():
    over = cores.available_cores() + 1
    result = benchmark("--only", "CRC32C", "--repeats", "1", "--threads", "1", str(over))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"threads: 1, {over} (oversubscribed)" in lines
    assert lines[lines.index("CRC32C, gpt2_numpy:") + 2] == f"| metric | 1 threads | {over} threads |"
    crc = next(line for line in lines if line.startswith("| CRC32C (MB/s) |")).strip("| ").split(" | ")
    assert len(crc) == 3 and all(float(cell.replace(",", "")) > 0 for cell in crc[1:])


def test_a_bad_benchmark_thread_count_is_one_error_line():
    result = benchmark("--only", "CRC32C", "--threads", "2", "0")
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and result.stdout == "" and len(lines) == 1, result.stderr
    assert lines[0] == "error: --threads 2 0: each count must be a whole number >= 1"
