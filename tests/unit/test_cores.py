"""cores.py: a long pass shares its pieces among threads, OpenBLAS on one thread meanwhile, and equals one core; the
default count follows the free cores; forks, pools and the counts set_threads refuses."""
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import numpy as np
import pytest

from gpt2_numpy import cores, fast
from gpt2_numpy import model as textbook
from gpt2_numpy.params import random_params
from tests.conftest import REPO, missing

HPARAMS = {"n_vocab": 97, "n_ctx": 48, "n_embd": 48, "n_head": 6, "n_layer": 2}


@pytest.fixture
def two_cores(monkeypatch):  # -> OpenBLAS's (set_num_threads, get_num_threads), set to 2 threads for the test
    blas = cores.openblas()
    if blas is None:  # CI's machine has NumPy's own OpenBLAS
        missing("no OpenBLAS found in this process: nothing for cores.py to share")
    before, settings = blas[1](), dict(cores.settings)
    cores.set_threads(2)  # given, so kept however busy the machine is
    monkeypatch.setattr(cores, "NARROW", 1)  # the small model of these tests shares its passes as a wide one would
    yield blas
    cores.settings.update(settings)
    blas[0](before)


def test_openblas_core_is_the_kernel_name_in_openblas_own_configuration():
    # the benchmark's header names the kernels: the name must be the one OpenBLAS's config string gives, read apart
    found = cores.openblas_library()
    if found is None:  # CI's machine has NumPy's own OpenBLAS
        missing("no OpenBLAS found in this process")
    library, prefix, suffix = found
    get_config = getattr(library, prefix + "get_config" + suffix)
    get_config.restype = ctypes.c_char_p
    core = cores.openblas_core()
    assert core and core in get_config().decode().split()  # e.g. "OpenBLAS 0.3.31 ... DYNAMIC_ARCH ... SkylakeX ..."


def pieces_run(n_items, team_size, monkeypatch, lead=0):  # -> [(piece, thread id)] of one split() in a team of
    # team_size
    monkeypatch.setattr(cores.team, "size", team_size, raising=False)
    ran, lock = [], threading.Lock()

    def work(piece):
        with lock:
            ran.append((piece, threading.get_ident()))

    cores.split(work, n_items, lead=lead)
    return ran


@pytest.mark.parametrize("n_items", [1, 2, 5, 12, 13])
def test_split_runs_each_item_once_in_contiguous_pieces_one_per_thread(n_items, monkeypatch):
    ran = pieces_run(n_items, 3, monkeypatch)
    pieces = sorted((piece.start, piece.stop) for piece, _ in ran)
    assert len(pieces) == min(3, n_items)
    assert pieces[0][0] == 0 and pieces[-1][1] == n_items
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(pieces, pieces[1:]))  # no gap, no overlap
    sizes = [stop - start for start, stop in pieces]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    callers = [piece for piece, thread in ran if thread == threading.get_ident()]
    assert callers == [slice(0, pieces[0][1])]  # the caller takes the first piece, the pool's threads the others


@pytest.mark.parametrize("n_items, team, caller_s, others",
                         [(24, 2, 14, [10]), (72, 3, 26, [23, 23]), (13, 3, 6, [3, 4]), (5, 3, 1, [2, 2]),
                          (3, 3, 1, [1, 1])])
def test_a_split_s_lead_goes_to_its_caller_and_leaves_each_other_thread_an_item(n_items, team, caller_s, others,
                                                                                 monkeypatch):
    # a lead of 4: the caller takes 4 items, then an even share of the rest with the others (24 on 2 threads: 4 + 10
    # and 10; 72 on 3: 4 + 22, 23 and 23). A lead larger than what every thread has beyond one item shrinks to that
    # (13 on 3: 3 + 3, 3 and 4; 5 on 3: none)
    ran = pieces_run(n_items, team, monkeypatch, lead=4)
    pieces = sorted((piece.start, piece.stop) for piece, _ in ran)
    assert pieces[0][0] == 0 and pieces[-1][1] == n_items
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(pieces, pieces[1:]))  # no gap, no overlap
    callers = [piece for piece, thread in ran if thread == threading.get_ident()]
    assert [piece.stop - piece.start for piece in callers] == [caller_s]
    assert [stop - start for start, stop in pieces[1:]] == others


def test_without_a_team_split_runs_everything_on_the_calling_thread(monkeypatch):
    monkeypatch.delattr(cores.team, "size", raising=False)
    assert pieces_run(12, None, monkeypatch) == [(slice(0, 12), threading.get_ident())]


@pytest.mark.parametrize("failing", [0, 1])  # the caller's piece, or the middle one of three
def test_a_piece_that_raises_raises_in_the_caller_after_every_piece_ends(failing, monkeypatch):
    monkeypatch.setattr(cores.team, "size", 3, raising=False)
    ended = []

    def work(piece):
        if piece.start // 2 == failing:
            raise ValueError("this piece failed")
        threading.Event().wait(0.2)  # the other pieces end well after the failing one raised
        ended.append(piece.start // 2)

    with pytest.raises(ValueError, match="this piece failed"):
        cores.split(work, 6)
    assert sorted(ended) == [piece for piece in range(3) if piece != failing]


def test_a_split_within_a_piece_runs_its_pieces_on_that_thread():
    # the pool runs one split at a time: a split inside a piece (or another thread's, at once) finds it taken and runs
    # its own pieces where it is called, one after another, instead of waiting for the pool that waits for it
    inner, caller = [], []

    def outer(piece):  # each piece splits again, in a team of 2, on the thread that runs it
        with cores.one_core():  # which gives the thread its own team back (a helper has none) when it ends
            cores.team.size = 2
            cores.split(lambda part: inner.append((part, threading.get_ident())), 4)

    def in_a_team():
        caller.append(threading.get_ident())
        cores.team.size = 2
        cores.split(outer, 2)

    thread = threading.Thread(target=in_a_team, daemon=True)  # a thread of its own, so that a hang fails the test
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "a split within a piece waited for the pool"
    assert sorted((part.start, part.stop) for part, _ in inner) == [(0, 2), (0, 2), (2, 4), (2, 4)]
    assert sorted((part.start, part.stop) for part, thread in inner if thread == caller[0]) == [(0, 2), (2, 4)]


@pytest.mark.timeout(20)
def test_a_split_interrupted_while_waiting_leaves_the_next_split_a_new_pool(monkeypatch):
    # Ctrl-C while the caller waits for a helper that still runs its piece: that helper must not be handed the next
    # split's piece, whose end its late signal would report before the piece ran
    monkeypatch.setattr(cores.team, "size", 2, raising=False)
    release = threading.Event()
    cores.split(lambda piece: None, 2)  # a pool of one helper
    first = cores.pool["helpers"][0]
    monkeypatch.setattr(cores.Helper, "wait", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        cores.split(lambda piece: release.wait(5) if piece.start else None, 2)
    monkeypatch.undo()
    monkeypatch.setattr(cores.team, "size", 2, raising=False)
    ran = []
    cores.split(lambda piece: ran.append(piece.start), 2)
    release.set()
    assert cores.pool["helpers"][0] is not first and sorted(ran) == [0, 1]
    for _ in range(100):  # the interrupted split's helper ends once its piece has
        if len(helper_threads()) <= 1:
            break
        time.sleep(0.05)
    assert len(helper_threads()) == 1


def record_heads_pieces(monkeypatch, get_num_threads):  # -> a set of (thread, OpenBLAS threads), one per heads piece
    ran_on, query_blocks = set(), fast.query_blocks

    def recorded(*args):
        ran_on.add((threading.get_ident(), get_num_threads()))
        return query_blocks(*args)

    monkeypatch.setattr(fast, "query_blocks", recorded)
    monkeypatch.setattr(fast, "ALL_CORES_FROM", 32)  # a short pass of a small model counts as long
    return ran_on


def test_a_long_pass_shares_heads_among_threads_with_openblas_on_one_and_equals_the_textbook(two_cores, monkeypatch):
    params = random_params(HPARAMS, seed=3)
    ids = np.random.default_rng(0).integers(0, HPARAMS["n_vocab"], 40)
    n_blas = two_cores[1]()
    ran_on = record_heads_pieces(monkeypatch, two_cores[1])
    logits = fast.gpt2(ids, **params, n_head=HPARAMS["n_head"])
    shared = set(ran_on)
    ran_on.clear()
    with cores.one_core():
        one_core_logits = fast.gpt2(ids, **params, n_head=HPARAMS["n_head"])
    alone = set(ran_on)
    assert 1 < len({thread for thread, _ in shared}) <= min(n_blas, HPARAMS["n_head"])  # OpenBLAS's count at most
    assert {blas_threads for _, blas_threads in shared} == {1}  # and OpenBLAS on one thread meanwhile
    assert alone == {(threading.get_ident(), n_blas)}  # one_core(): the caller's thread, OpenBLAS untouched
    assert two_cores[1]() == n_blas  # restored after the pass
    scale = np.abs(one_core_logits).max()
    assert np.abs(logits - one_core_logits).max() <= 1e-5 * scale
    assert np.abs(logits - textbook.gpt2(ids, **params, n_head=HPARAMS["n_head"])).max() <= 1e-5 * scale


def test_a_long_batch_with_padding_equals_one_core(two_cores, monkeypatch):
    params = random_params(HPARAMS, seed=4)
    ids = np.random.default_rng(1).integers(0, HPARAMS["n_vocab"], (3, 14))  # 42 positions in all: a long pass
    pad = np.array([0, 5, 13])  # left padding of each row

    def batch_logits():
        cache = fast.new_cache(params["wpe"], params["blocks"], HPARAMS["n_head"], pad=pad)
        return fast.gpt2_cached(ids, cache, **params, n_head=HPARAMS["n_head"])[0]

    ran_on = record_heads_pieces(monkeypatch, two_cores[1])
    logits = batch_logits()
    assert len({thread for thread, _ in ran_on}) > 1
    with cores.one_core():
        one_core_logits = batch_logits()
    for row, start in enumerate(pad):  # the real positions of each row
        real, alone = logits[row, start:], one_core_logits[row, start:]
        assert np.abs(real - alone).max() <= 1e-5 * np.abs(alone).max()


def test_openblas_threads_are_restored_when_a_pass_fails(two_cores, monkeypatch):
    n_blas = two_cores[1]()
    params = random_params(HPARAMS, seed=3)
    seen = []

    def failing_gelu(x):
        seen.append(two_cores[1]())
        raise MemoryError("out of memory in the middle of a pass")

    monkeypatch.setattr(fast, "gelu", failing_gelu)
    monkeypatch.setattr(fast, "ALL_CORES_FROM", 32)
    with pytest.raises(MemoryError):
        fast.gpt2(np.arange(40) % HPARAMS["n_vocab"], **params, n_head=HPARAMS["n_head"])
    assert seen == [1]  # the failure came inside the pass, with OpenBLAS on one thread
    assert two_cores[1]() == n_blas
    assert not hasattr(cores.team, "size")  # and the next pass starts without a team


def test_short_passes_and_decode_steps_leave_openblas_alone(two_cores, monkeypatch):
    params = random_params(HPARAMS, seed=3)
    ran_on = record_heads_pieces(monkeypatch, two_cores[1])
    cache = fast.new_cache(params["wpe"], params["blocks"], HPARAMS["n_head"])
    fast.gpt2_cached(np.arange(31), cache, **params, n_head=HPARAMS["n_head"])  # 31 < 32 positions
    fast.gpt2_cached(np.arange(1), cache, **params, n_head=HPARAMS["n_head"])  # a decode step
    assert ran_on == {(threading.get_ident(), two_cores[1]())}
    fast.gpt2(np.arange(32), **params, n_head=HPARAMS["n_head"])  # exactly ALL_CORES_FROM positions: a long pass
    assert len({thread for thread, _ in ran_on}) > 1


def test_long_passes_on_two_threads_at_once_equal_one_core_and_restore_openblas(two_cores, monkeypatch):
    n_blas = two_cores[1]()
    params = random_params(HPARAMS, seed=5)
    ids = [np.random.default_rng(seed).integers(0, HPARAMS["n_vocab"], 40) for seed in range(4)]
    monkeypatch.setattr(fast, "ALL_CORES_FROM", 32)
    with futures.ThreadPoolExecutor(2) as callers:  # two passes at once, each from its own thread, twice over
        logits = list(callers.map(lambda prompt: fast.gpt2(prompt, **params, n_head=HPARAMS["n_head"]), ids))
    assert two_cores[1]() == n_blas  # the last pass to end restored the count
    with cores.one_core():
        for prompt, shared in zip(ids, logits):
            alone = fast.gpt2(prompt, **params, n_head=HPARAMS["n_head"])
            assert np.abs(shared - alone).max() <= 1e-5 * np.abs(alone).max()


# The parent's pool has a thread when it forks, which the child does not inherit; the child then splits a pass in a
# team of two. Prints the pieces the child ran, then its wait status. A new Python, so that pytest never forks: a fork
# of a process with threads (ours, OpenBLAS's) is what Python 3.12+ warns of, and it is the case under test here.
FORK_AFTER_A_PASS = """
import os, signal, warnings
from gpt2_numpy import cores
warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
cores.team.size = 2
cores.split(lambda piece: None, 2)
child = os.fork()
if child == 0:
    signal.alarm(10)  # a child whose pieces wait for the parent's pool forever is killed, and the parent reports it
    ran = []
    cores.split(ran.append, 4)
    print(sorted((piece.start, piece.stop) for piece in ran), flush=True)
    os._exit(0)
print(os.waitpid(child, 0)[1])
"""


def test_a_forked_child_gets_threads_of_its_own():
    result = subprocess.run([sys.executable, "-c", FORK_AFTER_A_PASS], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO), cores.THREADS_VARIABLE: "2"})
    *child, status = result.stdout.splitlines()
    assert int(status) != signal.SIGALRM, "the forked child hung in its pass"
    assert int(status) == 0, result.stderr
    assert child == ["[(0, 2), (2, 4)]"]


def test_openblas_stays_on_one_thread_until_the_last_of_two_overlapping_passes_ends(two_cores):
    n_blas = two_cores[1]()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first_pass():
        with cores.all_cores():
            first_in.set()
            assert second_in.wait(10)
        first_out.set()

    def second_pass():  # -> (OpenBLAS's count, team size) once the first pass has ended and this one still runs
        assert first_in.wait(10)
        with cores.all_cores():
            second_in.set()
            assert first_out.wait(10)
            return two_cores[1](), cores.team_size()

    with futures.ThreadPoolExecutor(2) as callers:
        first, second = callers.submit(first_pass), callers.submit(second_pass)
        first.result(timeout=20)
        assert second.result(timeout=20) == (1, n_blas)  # the first pass to end left the count to the last
    assert two_cores[1]() == n_blas


# A thread of the parent's is inside a pass, or holds passes_lock with OpenBLAS already on one thread but the pass not
# yet counted, when the main thread forks; the child then runs a pass of its own. Prints the child's OpenBLAS count
# before, during and after its pass and its team size, then OpenBLAS's original count, the child's wait status and the
# parent's count once its pass ended.
FORK_DURING_A_PASS = """
import os, signal, sys, threading
from gpt2_numpy import cores
set_threads, get_threads = cores.openblas()
original = get_threads()
in_pass, finish = threading.Event(), threading.Event()

def set_and_wait(n):  # the first pass to set one thread waits there, holding the lock
    set_threads(n)
    if n == 1 and not in_pass.is_set():
        in_pass.set()
        finish.wait()

def a_pass():
    with cores.all_cores():
        in_pass.set()
        finish.wait()

if sys.argv[1] == "holding the lock":
    cores.openblas = lambda: (set_and_wait, get_threads)
thread = threading.Thread(target=a_pass)
thread.start()
in_pass.wait()
child = os.fork()
if child == 0:
    signal.alarm(10)  # a child that hangs is killed, and the parent reports it
    before = get_threads()
    with cores.all_cores():
        during = get_threads(), cores.team_size()
    print(before, *during, get_threads(), flush=True)
    os._exit(0)
_, status = os.waitpid(child, 0)
finish.set()
thread.join()
print(original, status, get_threads())
"""


@pytest.mark.parametrize("parent", ["inside a pass", "holding the lock"])
def test_a_child_forked_during_a_pass_runs_passes_and_gets_openblas_back(two_cores, parent):
    result = subprocess.run([sys.executable, "-c", FORK_DURING_A_PASS, parent], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO), cores.THREADS_VARIABLE: "2"})
    *child, (original, status, parent_after) = [list(map(int, line.split())) for line in result.stdout.splitlines()]
    assert status != signal.SIGALRM, "the forked child hung in its pass"
    assert status == 0, result.stderr
    # the child starts with OpenBLAS's count from before the parent's pass, and its own pass shares it
    assert child == [[original, 1, original, original]]
    assert original >= 2 and parent_after == original


# The main thread forks inside its own pass: the child goes on with that pass, which ends there as in the parent.
# Prints, in the child: the passes counted and OpenBLAS's count inside the pass, after it, within a pass of its own
# (and its team), and after that; then, in the parent, the child's wait status.
FORK_INSIDE_A_PASS = """
import os, signal, warnings
from gpt2_numpy import cores
warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
get_threads = cores.openblas()[1]
cores.set_threads(2)
with cores.all_cores():
    child = os.fork()
    if child == 0:
        signal.alarm(10)
        inside = cores.passes["running"], get_threads()
if child == 0:
    after = cores.passes["running"], get_threads()
    with cores.all_cores():
        again = cores.passes["running"], get_threads(), cores.team_size()
    print(*inside, *after, *again, cores.passes["running"], get_threads(), flush=True)
    os._exit(0)
print(os.waitpid(child, 0)[1])
"""


def test_a_fork_inside_a_pass_leaves_that_pass_to_end_in_the_child(two_cores):
    result = subprocess.run([sys.executable, "-c", FORK_INSIDE_A_PASS], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    child, status = result.stdout.splitlines()
    assert int(status) == 0, result.stderr
    # inside: its one pass, OpenBLAS on one thread; after: none, OpenBLAS back on 2; a pass of its own as any other
    assert child.split() == ["1", "1", "0", "2", "1", "1", "2", "0", "2"]


def helper_threads():  # -> the threads of our pools now alive
    return [thread for thread in threading.enumerate() if thread.name.startswith("gpt2_numpy")]


def test_a_sweep_of_thread_counts_leaves_no_idle_pool_behind(two_cores, monkeypatch):
    monkeypatch.setattr(cores, "MIN_WORK", 1)  # every split of 64 items goes to the whole team
    for count in [*range(1, 17), 2]:  # as a sweep of the benchmark's, then back to 2
        cores.set_threads(count)
        with cores.all_cores():
            cores.split(lambda piece: time.sleep(0.002), 64)  # each piece long enough for every thread to start
    for _ in range(100):  # a released pool's threads end once they see it shut down
        if len(helper_threads()) <= 1:
            break
        time.sleep(0.05)
    assert len(helper_threads()) == 1  # the pool of the last team of 2: the caller and one helper


@pytest.mark.parametrize("count", [2.7, 2.0, True, False, "2.7", "", None, 0, -1])
def test_set_threads_refuses_what_is_not_a_whole_count(count):
    before = dict(cores.settings)
    with pytest.raises(ValueError, match="is not a whole number of threads >= 1"):
        cores.set_threads(count)
    assert cores.settings == before


def test_set_threads_takes_whole_numbers_of_any_kind(two_cores):
    assert cores.set_threads(np.int64(3)) == 3 and cores.set_threads(" 2 ") == 2 and cores.threads() == 2


def test_the_default_count_is_the_cores_other_processes_leave_free(two_cores, monkeypatch):
    # a machine of 2 cores seen through /proc: seconds, busy clock ticks of both cores and our CPU seconds
    ticks = os.sysconf("SC_CLK_TCK")
    clock, busy, ours = [100.0], [0], [0.0]
    monkeypatch.setattr(cores, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cores, "busy_ticks", lambda: busy[0])
    monkeypatch.setattr(cores, "own_cpu_seconds", lambda: ours[0])
    monkeypatch.setattr(cores, "available_cores", lambda: 2)
    monkeypatch.setattr(cores, "runnable_tasks", lambda: 2)  # at the first reading: another task runs beside us
    monkeypatch.setitem(cores.load, "at", None)
    cores.settings.update(threads=None, read=True)  # no count given
    seen = [(cores.threads(), two_cores[1]())]
    for others, ours_share in [(1.0, 1.0), (0.0, 2.0), (0.6, 1.4), (0.4, 1.6), (1.0, 1.0)]:  # cores busy in 1 s
        clock[0] += cores.LOAD_WINDOW / 2
        seen.append((cores.threads(), two_cores[1]()))  # within a window: as it was
        clock[0] += 1 - cores.LOAD_WINDOW / 2
        busy[0] += round((others + ours_share) * ticks)
        ours[0] += ours_share
        seen.append((cores.threads(), two_cores[1]()))
    assert seen == [(1, 1), (1, 1), (1, 1), (1, 1), (2, 2), (2, 2), (1, 1), (1, 1), (2, 2), (2, 2), (1, 1)]
    with cores.all_cores():  # a long pass on a busy machine: a team of one, which shares nothing
        assert cores.team_size() == 1
    cores.set_threads(2)  # a count given is kept, however busy
    clock[0] += 1
    busy[0] += 2 * ticks
    assert (cores.threads(), two_cores[1]()) == (2, 2)



def where_pieces_ran(n_pieces=2, work=None):  # -> {piece start: (its core, the cores its thread might run on)}
    seen = {}

    def record(piece):
        seen[piece.start] = (cores.current_cpu(), os.sched_getaffinity(0))
        if work is not None:
            work(piece)

    cores.split(record, n_pieces)
    return seen


@pytest.fixture
def placed(two_cores, monkeypatch):  # -> the cores this thread may run on; skips where threads cannot be placed
    if cores.sched_getcpu() is None or len(os.sched_getaffinity(0)) < 2:  # CI's machine is Linux, with 2 cores
        missing("keep_apart() needs Linux's sched_setaffinity, glibc's sched_getcpu and 2 cores")
    monkeypatch.setitem(cores.placement, "off", False)
    return os.sched_getaffinity(0)


def test_a_split_keeps_its_caller_on_its_core_and_the_pool_off_it_while_it_runs(placed):
    # the kernels of this project's machines wake a thread on the core of the one that woke it (cores.keep_apart)
    with cores.all_cores():
        for _ in range(2):  # the second split finds the pool placed, and places its caller again
            (caller_cpu, caller_cores), (helper_cpu, helper_cores) = where_pieces_ran().values()
            assert caller_cores == {caller_cpu}
            assert helper_cores == placed - {caller_cpu} and helper_cpu != caller_cpu
            assert os.sched_getaffinity(0) == placed  # free again between splits


def test_a_split_whose_piece_raises_leaves_its_caller_free(placed):
    def fail(piece):
        raise ValueError("this piece failed")

    with cores.all_cores(), pytest.raises(ValueError, match="this piece failed"):
        where_pieces_ran(work=fail)
    assert os.sched_getaffinity(0) == placed


def test_where_the_system_refuses_placing_threads_the_pieces_run_as_they_fall(placed, monkeypatch):
    calls = []

    def refused(*args):
        calls.append(args)
        raise PermissionError("not in this sandbox")

    monkeypatch.setattr(os, "sched_setaffinity", refused)
    with cores.all_cores():
        assert sorted(where_pieces_ran(4)) == [0, 2]
        assert sorted(where_pieces_ran(4)) == [0, 2]
    assert cores.placement["off"] and len(calls) == 1  # asked once, then never again


def test_the_pool_moves_off_its_callers_core_wherever_the_caller_runs(placed):
    with cores.all_cores():
        for cpu in sorted(placed)[:2]:
            for _ in range(10):  # moved there, the caller stays until the scheduler has a reason to move it
                os.sched_setaffinity(0, {cpu})
                os.sched_setaffinity(0, placed)
                (caller_cpu, _), (_, helper_cores) = where_pieces_ran().values()
                if caller_cpu == cpu:
                    break
            assert caller_cpu == cpu and helper_cores == placed - {cpu}
