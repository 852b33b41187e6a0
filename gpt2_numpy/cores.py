"""Every core for a long forward pass: its products and attention's heads in pieces, on threads of our own.

NumPy runs attention's elementwise passes (mask, max, exp, sums) on one core; only its matrix products use the others,
through OpenBLAS's threads. Those threads spin on their cores for about a tenth of a second after each product before
they sleep, so a thread of ours given half of the heads would find its core taken. Within all_cores(), OpenBLAS runs
one thread and its workers go to sleep, and split() hands the pieces of a pass (a linear layer's output columns,
attention's heads) to as many threads of ours as OpenBLAS had, each piece on one core. NumPy releases the GIL inside
its loops and BLAS calls, so the threads run at once.

Where NumPy's BLAS is not an OpenBLAS found in /proc/self/maps (Linux), or it runs one thread, nothing changes: every
piece runs on the calling thread. OpenBLAS's thread count belongs to the whole process: a product that another thread
of the program runs during such a pass runs on one core. The count is restored when the pass ends, however it ends.
"""
import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

# NumPy's wheels bundle scipy-openblas, whose symbols carry a prefix and, for its 64-bit integers, a suffix
OPENBLAS_NAMES = [(prefix + "set_num_threads" + suffix, prefix + "get_num_threads" + suffix)
                  for prefix in ("scipy_openblas_", "openblas_") for suffix in ("64_", "")]

team = threading.local()  # team.size: the threads that share each split() of the current pass on this thread


@functools.cache
def openblas():  # -> (set_num_threads, get_num_threads) of the OpenBLAS loaded into this process, or None
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split(maxsplit=5)[5].strip() for line in maps
                            if "openblas" in line.lower() and len(line.split(maxsplit=5)) == 6})
    except OSError:  # not Linux
        return None
    for path in paths:
        try:
            library = ctypes.CDLL(path)  # already loaded by NumPy: this only finds it
        except OSError:
            continue
        for set_name, get_name in OPENBLAS_NAMES:
            if hasattr(library, set_name) and hasattr(library, get_name):
                return getattr(library, set_name), getattr(library, get_name)
    return None


@contextmanager
def all_cores(enabled=True):  # within: split() shares its pieces among as many threads as OpenBLAS had
    blas = openblas()
    n_threads = blas[1]() if blas and enabled and getattr(team, "size", None) is None else 1
    if n_threads <= 1:  # nothing to share, no OpenBLAS to set, or a pass within a pass (which keeps its team)
        yield
        return
    blas[0](1)
    team.size = n_threads
    try:
        yield
    finally:
        del team.size
        blas[0](n_threads)


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


def split(work, n_items):  # work(piece) for contiguous slices that cover range(n_items), one slice per thread
    n_threads = min(getattr(team, "size", None) or 1, n_items)
    if n_threads <= 1:
        work(slice(0, n_items))
        return
    bounds = [n_items * i // n_threads for i in range(n_threads + 1)]
    pieces = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    others = [helpers(n_threads - 1).submit(work, piece) for piece in pieces[1:]]
    try:
        work(pieces[0])  # the calling thread takes a piece too
    finally:
        for other in others:  # all done before the caller goes on, even if a piece raised; then theirs raise
            other.result()


@functools.cache
def helpers(n):  # -> a pool of n threads, made once
    return ThreadPoolExecutor(n, thread_name_prefix="gpt2_numpy")


# a forked child has none of its parent's threads: the parent's pool would queue its pieces forever
os.register_at_fork(after_in_child=helpers.cache_clear)
