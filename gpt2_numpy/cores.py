"""Every core for a long forward pass: its products and attention's queries in pieces, on threads of our own.

How many cores a pass may use is one count for the whole process, threads(): set_threads(n), the commands' --threads N,
else $GPT2_NUMPY_THREADS, else the cores the process may run on (its CPU affinity). It bounds NumPy's BLAS (OpenBLAS,
set through ctypes) and our own threads together, never both at once: outside a long pass OpenBLAS runs that many
threads (a decode step's products, the lm head of a short pass); within all_cores() it runs one, and split() hands the
pieces of a pass (a linear layer's output columns, attention's queries, GELU's elements, layer norm's rows, a training
step's products and passes) to up to that many threads of ours, each piece's products on one thread. NumPy releases the
GIL inside its loops and BLAS calls, so the threads run at once. A split gives each thread at least MIN_WORK elements
(or multiply-adds) where its caller gives their size: a smaller piece costs more to hand over than it saves.

NumPy runs elementwise passes (mask, max, exp, sums) on one core; only its products use OpenBLAS's threads, which spin
on their cores for about a tenth of a second after each product before they sleep, so a thread of ours beside them
would find its core taken: hence OpenBLAS on one thread within a pass, whose workers sleep once their spin times out.

The first pass finds NumPy's OpenBLAS once, in /proc/self/maps (Linux), else among NumPy's bundled libraries. Where
there is none to find (MKL, Accelerate) our threads stay off and that BLAS keeps its own count: two pools at once would
oversubscribe the cores. OpenBLAS's thread count belongs to the whole process: a product that another thread of the
program runs meanwhile runs on one thread. Passes on several threads at once share the setting, and the last to end
restores the count, however it ends. A forked child runs none of its parent's threads, so none of its passes: it
starts with no pass under way and OpenBLAS's count from before them.
"""
import contextvars
import ctypes
import functools
import glob
import os
import threading
from concurrent import futures
from contextlib import contextmanager

import numpy as np

# NumPy's wheels bundle scipy-openblas, whose symbols carry a prefix and, for its 64-bit integers, a suffix
OPENBLAS_NAMES = [(prefix + "set_num_threads" + suffix, prefix + "get_num_threads" + suffix)
                  for prefix in ("scipy_openblas_", "openblas_") for suffix in ("64_", "_64", "")]

THREADS_VARIABLE = "GPT2_NUMPY_THREADS"
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")  # OpenBLAS reads them in this order
# elements (or multiply-adds) per thread of a split, at least: about 0.2 ms of layer norm, about what a split of no
# work costs on a 2-core VM (about 200 us: scripts/dev/bounds.py), less where the cores are idle and not virtual
MIN_WORK = 1 << 17
team = threading.local()  # team.size: the threads that share each split() of the current pass on this thread
# long passes under way in the process, and OpenBLAS's count before them (None until a first pass reads it)
passes = {"running": 0, "n_threads": None}
passes_lock = threading.Lock()
settings = {"threads": None}  # the count set_threads() chose; None until the first pass or set_threads()


@functools.cache
def openblas():  # -> (set_num_threads, get_num_threads) of the OpenBLAS NumPy loaded, or None
    for path in sorted(loaded_openblas() or bundled_openblas(), key=lambda path: ("numpy" not in path, path)):
        try:  # NumPy's own before SciPy's or others
            library = ctypes.CDLL(path)  # already loaded: this only finds it
        except OSError:
            continue
        for set_name, get_name in OPENBLAS_NAMES:
            if hasattr(library, set_name) and hasattr(library, get_name):
                set_num_threads = getattr(library, set_name)
                set_num_threads.restype = None
                return set_num_threads, getattr(library, get_name)
    return None


def loaded_openblas():  # -> the paths of the OpenBLAS libraries this process mapped (Linux), or none
    try:
        with open("/proc/self/maps", "rb") as maps:
            return {os.fsdecode(line.split(maxsplit=5)[5].strip()) for line in maps
                    if b"openblas" in line.lower() and len(line.split(maxsplit=5)) == 6}
    except OSError:  # not Linux
        return set()


def bundled_openblas():  # -> the OpenBLAS that NumPy's wheels bundle beside it (macOS on Intel, Windows), or none
    import numpy  # noqa: PLC0415 (the caller of any pass imported it already)

    site = os.path.dirname(os.path.dirname(numpy.__file__))
    return {path for folder in ("numpy.libs", os.path.join("numpy", ".dylibs"))
            for path in glob.glob(os.path.join(site, folder, "*openblas*"))}


def available_cores():  # -> the cores this process may run on
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def parse_threads(text, source):  # -> int >= 1 from text; ValueError naming source (a flag or the variable)
    try:
        count = int(text)
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise ValueError(f"{source}={text} is not a whole number of threads >= 1: give e.g. {available_cores()} "
                         "(the cores this process may run on), or 1")
    return count


def threads():  # -> the cores a pass may use: set_threads()'s count, else $GPT2_NUMPY_THREADS's, else every core
    if settings["threads"] is None:  # the first pass applies it to OpenBLAS too
        variable = os.environ.get(THREADS_VARIABLE)
        set_threads(default_threads() if variable is None else parse_threads(variable, THREADS_VARIABLE))
    return settings["threads"]


def default_threads():  # -> the count a user gave the BLAS ($OPENBLAS_NUM_THREADS, $OMP_NUM_THREADS), else every core
    # a count set for NumPy's BLAS alone is the user's word on how many cores to use: kept, not raised to every core
    for name in BLAS_VARIABLES:
        try:
            count = int(os.environ.get(name, ""))
        except ValueError:  # unset, or not a number (OpenBLAS ignores it too)
            continue
        if count >= 1:
            return count
    return available_cores()


def set_threads(count):  # -> count; from now on passes use up to count cores, and OpenBLAS runs count threads
    """Set how many cores gpt2_numpy's passes may use: OpenBLAS's threads outside a long pass, ours within one. More
    than the machine's cores is allowed (they then share them)."""
    count = parse_threads(count, "threads")
    blas = openblas()
    with passes_lock:
        settings["threads"] = count
        if blas is None:
            return count
        if passes["running"]:  # a pass under way keeps OpenBLAS on one thread; the last to end sets this count
            passes["n_threads"] = count
        else:
            blas[0](count)
    return count


@contextmanager
def all_cores(enabled=True):  # within: split() shares its pieces among threads() threads
    count = threads()
    blas = openblas() if enabled and count > 1 and getattr(team, "size", None) is None else None  # a pass in a pass
    if blas is None:  # keeps its team
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
        team.size = count
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


def split(work, n_items, item_size=MIN_WORK):  # work(piece) for contiguous slices that cover range(n_items), one per
    # thread; item_size: the elements (or multiply-adds) of one item, of which each thread gets MIN_WORK at least
    n_threads = min(team_size(), n_items, max(1, n_items * item_size // MIN_WORK))
    if n_threads <= 1:
        work(slice(0, n_items))
        return
    bounds = [n_items * i // n_threads for i in range(n_threads + 1)]
    pieces = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    # each piece runs in a copy of the caller's context, so that np.errstate (a context variable) holds on every thread
    pool = helpers(team_size() - 1)
    others = [pool.submit(contextvars.copy_context().run, work, piece) for piece in pieces[1:]]
    try:
        work(pieces[0])  # the calling thread takes a piece too
    finally:
        futures.wait(others)  # every piece ends before the caller goes on, even if one raised
    for other in others:
        other.result()  # a helper's exception, if any, raises here


COLUMNS, ROWS, INNER = "columns", "rows", "inner"  # how matmul() shares a product


def matmul(a, b, bias=None, over=COLUMNS):  # [n, k] @ [k, m] (+ bias [m]) -> [n, m], its pieces shared by split()
    # Within all_cores() OpenBLAS runs one thread, so a product's pieces go to the team; outside, it is one product on
    # OpenBLAS's threads. over picks the pieces by what each thread reads: COLUMNS of the result, all of a and its
    # columns of b (a linear layer: x is the smaller); ROWS, its rows of a and all of b (dwte = dlogitsᵀ x); INNER,
    # its part of k of both into a partial product of its own, the partials summed in order (dx = dlogits wte: by
    # columns or rows every thread would read all of the [n, 50257] dlogits). The bias is added by each piece while
    # its output is in cache
    n, k, m = a.shape[0], a.shape[1], b.shape[1]
    out = np.empty((n, m), np.result_type(a, b))
    if over == INNER:
        partials = {}

        def inner(piece):  # the first piece's partial goes to out, each other's to an array of its own
            partials[piece.start] = np.matmul(a[:, piece], b[piece], out=out if piece.start == 0 else None)

        split(inner, k, item_size=n * m)  # a step of k: n x m multiply-adds
        for start in sorted(partials)[1:]:
            out += partials[start]
        if bias is not None:
            out += bias
        return out
    by_rows = over == ROWS

    def product(piece):
        part = (piece, slice(None)) if by_rows else (slice(None), piece)
        np.matmul(a[piece] if by_rows else a, b if by_rows else b[:, piece], out=out[part])
        if bias is not None:
            out[part] += bias[part[1]]

    split(product, n if by_rows else m, item_size=k * (m if by_rows else n))  # a row's or a column's multiply-adds
    return out


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
