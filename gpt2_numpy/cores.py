"""Every core for a long forward pass: its products and attention's heads in pieces, on threads of our own.

NumPy runs attention's elementwise passes (mask, max, exp, sums) on one core; only its matrix products use the others,
through OpenBLAS's threads. Those threads spin on their cores for about a tenth of a second after each product before
they sleep, so a thread of ours given half of the heads would find its core taken. Within all_cores(), OpenBLAS runs
one thread, so its workers sleep once their spin times out, and split() hands the pieces of a pass (a linear layer's
output columns, attention's heads, GELU's chunks) to as many threads of ours as OpenBLAS had, each piece's products on
one thread. NumPy releases the GIL inside its loops and BLAS calls, so the threads run at once.

The first long pass finds NumPy's OpenBLAS once, in /proc/self/maps (Linux). Where there is none to find, or it runs
one thread, nothing changes: every piece runs on the calling thread. OpenBLAS's thread count belongs to the whole
process: a product that another thread of the program runs meanwhile runs on one thread. Passes on several threads at
once share the setting, and the last to end restores the count, however it ends. A forked child runs none of its
parent's threads, so none of its passes: it starts with no pass under way and OpenBLAS's count from before them.
"""
import contextvars
import ctypes
import functools
import os
import threading
from concurrent import futures
from contextlib import contextmanager

# NumPy's wheels bundle scipy-openblas, whose symbols carry a prefix and, for its 64-bit integers, a suffix
OPENBLAS_NAMES = [(prefix + "set_num_threads" + suffix, prefix + "get_num_threads" + suffix)
                  for prefix in ("scipy_openblas_", "openblas_") for suffix in ("64_", "_64", "")]

team = threading.local()  # team.size: the threads that share each split() of the current pass on this thread
# long passes under way in the process, and OpenBLAS's count before them (None until a first pass reads it)
passes = {"running": 0, "n_threads": None}
passes_lock = threading.Lock()


@functools.cache
def openblas():  # -> (set_num_threads, get_num_threads) of the OpenBLAS NumPy loaded, or None
    try:
        with open("/proc/self/maps", "rb") as maps:
            paths = {os.fsdecode(line.split(maxsplit=5)[5].strip()) for line in maps
                     if b"openblas" in line.lower() and len(line.split(maxsplit=5)) == 6}
    except OSError:  # not Linux
        return None
    for path in sorted(paths, key=lambda path: ("numpy" not in path, path)):  # NumPy's own before SciPy's or others
        try:
            library = ctypes.CDLL(path)  # already loaded: this only finds it
        except OSError:
            continue
        for set_name, get_name in OPENBLAS_NAMES:
            if hasattr(library, set_name) and hasattr(library, get_name):
                set_num_threads = getattr(library, set_name)
                set_num_threads.restype = None
                return set_num_threads, getattr(library, get_name)
    return None


@contextmanager
def all_cores(enabled=True):  # within: split() shares its pieces among as many threads as OpenBLAS had
    blas = openblas() if enabled and getattr(team, "size", None) is None else None  # a pass in a pass keeps its team
    if blas is None:
        yield
        return
    entered = False
    try:
        with passes_lock:  # the first pass to start reads the count and sets one thread, the last to end restores it
            if passes["running"] == 0:
                passes["n_threads"] = blas[1]()
                blas[0](1)
            passes["running"] += 1
            entered = True
        team.size = passes["n_threads"]
        yield
    finally:
        team.__dict__.pop("size", None)
        if entered:
            with passes_lock:
                passes["running"] -= 1
                if passes["running"] == 0:
                    blas[0](passes["n_threads"])


@contextmanager
def one_core():  # within: every split() runs on the calling thread, all_cores() or not (tests, benchmark.py)
    outer = getattr(team, "size", None)
    team.size = 1
    try:
        yield
    finally:
        team.size = outer
        if outer is None:
            del team.size


def team_size():  # -> the threads that share each split() here: 1 outside a long pass
    return getattr(team, "size", None) or 1


def split(work, n_items):  # work(piece) for contiguous slices that cover range(n_items), one slice per thread
    n_helpers = team_size() - 1
    n_threads = min(n_helpers + 1, n_items)
    if n_threads <= 1:
        work(slice(0, n_items))
        return
    bounds = [n_items * i // n_threads for i in range(n_threads + 1)]
    pieces = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    # each piece runs in a copy of the caller's context, so that np.errstate (a context variable) holds on every thread
    others = [helpers(n_helpers).submit(contextvars.copy_context().run, work, piece) for piece in pieces[1:]]
    try:
        work(pieces[0])  # the calling thread takes a piece too
    finally:
        futures.wait(others)  # every piece ends before the caller goes on, even if one raised
    for other in others:
        other.result()  # a helper's exception, if any, raises here


@functools.cache
def helpers(n):  # -> a pool of n threads, made once
    return futures.ThreadPoolExecutor(n, thread_name_prefix="gpt2_numpy")


def after_fork_in_child():  # -> None; the child has none of its parent's threads, and so none of their passes
    global passes_lock
    helpers.cache_clear()  # the parent's pool would queue the child's pieces forever
    # A thread of the parent's was inside a pass, or held the lock (so the count may be set but not yet counted): the
    # count it set is the child's for good, as no pass of the child's will end it, and the held lock would never be
    # released.
    if (passes["running"] or passes_lock.locked()) and passes["n_threads"] is not None:
        openblas()[0](passes["n_threads"])
    passes_lock = threading.Lock()
    passes["running"] = 0


os.register_at_fork(after_in_child=after_fork_in_child)
