"""Every core for a long forward pass: its products and attention's queries in pieces, on threads of our own.

How many cores a pass may use is one count for the whole process, threads(): set_threads(n), the commands' --threads N,
else $GPT2_NUMPY_THREADS, else a count given to NumPy's BLAS ($OPENBLAS_NUM_THREADS, $OMP_NUM_THREADS); each of these
is kept as given. Without any, the count is the cores that other processes leave free (free_cores(): the cores the
process may run on, its CPU affinity, less the share of them that others kept busy over the last LOAD_WINDOW seconds of
/proc/stat), read again at each pass once a window has passed: a thread that shares its core with another process
waits for the scheduler at every hand-over, so on a busy machine one thread runs faster than two.

The count bounds NumPy's BLAS (OpenBLAS, set through ctypes) and our own threads together, never both at once: outside
a long pass OpenBLAS runs that many threads (a decode step's products, the lm head of a short pass); within all_cores()
it runs one, and split() hands the pieces of a pass (a linear layer's output columns, attention's queries, GELU's
elements, layer norm's rows, a training step's products and passes) to up to that many threads of ours, each piece's
products on one thread. NumPy releases the GIL inside its loops and BLAS calls, so the threads run at once. While a
split runs, its caller stays on its core and our other threads off it (keep_apart()), where Linux allows. A split
gives each thread at least MIN_WORK elements (or multiply-adds) where its caller gives their size: a smaller piece
costs more to hand over than it saves. A model narrower than NARROW runs every pass on one thread, OpenBLAS's and ours,
whatever the count (for_model()): its products are too small to gain from a second thread.

NumPy runs elementwise passes (mask, max, exp, sums) on one core; only its products use OpenBLAS's threads, which spin
on their cores for a while after each product before they sleep, so a thread of ours beside them would find its core
taken: hence OpenBLAS on one thread within a pass, whose workers sleep once their spin times out.

The first pass finds NumPy's OpenBLAS once, in /proc/self/maps (Linux), else among NumPy's bundled libraries. Where
there is none to find (MKL, Accelerate) our threads stay off and that BLAS keeps its own count: two pools at once would
oversubscribe the cores. OpenBLAS's thread count belongs to the whole process: a product that another thread of the
program runs meanwhile runs on one thread. Passes on several threads at once share the setting, and the last to end
restores the count, however it ends. A forked child runs none of its parent's threads: it starts with only the pass of
the thread that forked, if that one was in a pass, and OpenBLAS's count from before the others.
"""
import contextlib
import contextvars
import ctypes
import functools
import glob
import numbers
import os
import threading
from contextlib import contextmanager
from time import monotonic
from typing import NamedTuple, Optional

import numpy as np

# NumPy's wheels bundle scipy-openblas, whose symbols carry a prefix and, for its 64-bit integers, a suffix
OPENBLAS_AFFIXES = [(prefix, suffix) for prefix in ("scipy_openblas_", "openblas_") for suffix in ("64_", "_64", "")]

THREADS_VARIABLE = "GPT2_NUMPY_THREADS"
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")  # OpenBLAS reads them in this order
# elements (or multiply-adds) per thread of a split, at least: a share of layer norm that takes about as long as
# handing a piece to a waiting thread of the pool costs (docs/making-it-fast.md, as measured by scripts/dev/bounds.py)
MIN_WORK = 1 << 17
NARROW = 64  # widths (n_embd) below which a model's passes run on one thread: their products, whose inner axis is the
# width, hold too little work per output to pay for a second thread's hand-over, and their runs end before the free
# cores are read twice, where a wrong guess costs many times what a right one gains (docs/making-it-fast.md:
# scripts/dev/bounds.py --line measures it)
LOAD_WINDOW = 0.25  # seconds of /proc/stat between two readings of the free cores: 25 clock ticks a core at least
team = threading.local()  # team.size: the threads that share each split() of the current pass on this thread;
# team.entered: this thread's passes that hold OpenBLAS on one thread (a forked child keeps those of the thread forking)
# long passes under way in the process, and OpenBLAS's count before them (None until a first pass reads it)
passes = {"running": 0, "n_threads": None}
passes_lock = threading.Lock()
# threads: the count given (set_threads, $GPT2_NUMPY_THREADS, the BLAS's variables), None for the free cores; read:
# whether the variables were read; applied: the count OpenBLAS was last given outside a pass
settings = {"threads": None, "read": False, "applied": None}
load = {"at": None, "busy": 0, "ours": 0.0, "free": None}  # the last reading of /proc/stat, and the free cores then
pool = {"size": 0, "helpers": []}  # our helper threads: one pool, of the size the last split asked for
# keep_apart()'s: the caller's core and cores it last kept the pool's threads off and on; off: the system refused
placement = {"apart": None, "off": False}
pool_lock = threading.Lock()  # held by the split whose pieces the pool runs


@functools.cache
def openblas():  # -> (set_num_threads, get_num_threads) of the OpenBLAS NumPy loaded, or None
    found = openblas_library()
    if found is None:
        return None
    library, prefix, suffix = found
    set_num_threads = getattr(library, prefix + "set_num_threads" + suffix)
    set_num_threads.restype = None
    return set_num_threads, getattr(library, prefix + "get_num_threads" + suffix)


@functools.cache
def openblas_core():  # -> the name of the kernels OpenBLAS chose for this CPU ("Haswell", "SkylakeX", ...), or None
    found = openblas_library()
    get_corename = found and getattr(found[0], found[1] + "get_corename" + found[2], None)
    if not get_corename:
        return None
    get_corename.restype = ctypes.c_char_p
    return get_corename().decode()


@functools.cache
def openblas_library():  # -> (the OpenBLAS NumPy loaded, its symbols' prefix and suffix), or None
    for path in sorted(loaded_openblas() or bundled_openblas(), key=lambda path: ("numpy" not in path, path)):
        try:  # NumPy's own before SciPy's or others
            library = ctypes.CDLL(path)  # already loaded: this only finds it
        except OSError:
            continue
        for prefix, suffix in OPENBLAS_AFFIXES:
            if all(hasattr(library, prefix + name + suffix) for name in ("set_num_threads", "get_num_threads")):
                return library, prefix, suffix
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


def free_cores():  # -> the cores of this process's affinity that other processes left idle, at least 1
    """The cores this process may run on, less those that other processes kept busy over the last LOAD_WINDOW seconds
    (from /proc/stat, less this process's own CPU time); before a first window has passed, less the other processes
    runnable right now (/proc/loadavg). Every core where /proc is not there to read (macOS, Windows)."""
    now, cores = monotonic(), available_cores()
    if load["at"] is not None and now - load["at"] < LOAD_WINDOW:
        return load["free"]
    busy, ours = busy_ticks(), own_cpu_seconds()
    if busy is None:
        return cores
    if load["at"] is None:  # no window yet: the tasks runnable now, less the thread reading them
        others = max(0, runnable_tasks() - 1)
    else:  # the others' CPU time over the window, in cores
        ticks = os.sysconf("SC_CLK_TCK")
        others = max(0.0, ((busy - load["busy"]) / ticks - (ours - load["ours"])) / (now - load["at"]))
    load.update(at=now, busy=busy, ours=ours, free=max(1, cores - round(others)))
    return load["free"]


def busy_ticks():  # -> the clock ticks the cores of this process's affinity spent busy since boot, or None
    try:
        allowed = os.sched_getaffinity(0)
        with open("/proc/stat", "rb") as stat:
            lines = [line.split() for line in stat if line.startswith(b"cpu")]
    except (AttributeError, OSError):  # not Linux
        return None
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy (steal: another machine's)
    return sum(sum(map(int, fields[1:4] + fields[6:9])) for fields in lines
               if fields[0] != b"cpu" and int(fields[0][3:]) in allowed)


def own_cpu_seconds():  # -> the CPU time of this process, every thread of it, since it started
    return sum(os.times()[:2])


def runnable_tasks():  # -> the tasks runnable on the machine now, this one included (/proc/loadavg's fourth field)
    try:
        with open("/proc/loadavg", "rb") as loadavg:
            return int(loadavg.read().split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return 1


def parse_threads(value, source):  # -> int >= 1 from value (text or a whole number); ValueError naming source
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)  # 2.7 is no count, nor True
    if isinstance(value, str):
        value = value.strip()
        whole = value.isdigit()
    if not whole or int(value) < 1:
        raise ValueError(f"{source}={value} is not a whole number of threads >= 1: give e.g. {available_cores()} "
                         "(the cores this process may run on), or 1")
    return int(value)


def threads():  # -> the cores a pass may use now: the count given, else the free cores
    count = given_threads() or free_cores()
    if count != settings["applied"]:
        apply(count)
    return count


def blas_threads():  # -> the threads OpenBLAS runs a product on now: one within a pass, else threads()
    blas = openblas()
    return blas[1]() if blas else 1


def given_threads():  # -> the count given (set_threads, $GPT2_NUMPY_THREADS, the BLAS's variables), or None
    if not settings["read"]:  # the first pass reads the variables; ValueError for a bad $GPT2_NUMPY_THREADS
        variable = os.environ.get(THREADS_VARIABLE)
        settings["threads"] = blas_variable() if variable is None else parse_threads(variable, THREADS_VARIABLE)
        settings["read"] = True
    return settings["threads"]


def blas_variable():  # -> the count a user gave the BLAS ($OPENBLAS_NUM_THREADS, $OMP_NUM_THREADS), or None
    # a count set for NumPy's BLAS alone is the user's word on how many cores to use: kept, not raised to every core
    for name in BLAS_VARIABLES:
        try:
            count = int(os.environ.get(name, ""))
        except ValueError:  # unset, or not a number (OpenBLAS ignores it too)
            continue
        if count >= 1:
            return count
    return None


def set_threads(count):  # -> count; from now on passes use up to count cores, and OpenBLAS runs count threads
    """Set how many cores gpt2_numpy's passes may use: OpenBLAS's threads outside a long pass, ours within one. More
    than the machine's cores is allowed (they then share them). The count is kept as given, however busy the
    machine; without one, passes use the cores that other processes leave free."""
    count = parse_threads(count, "threads")
    settings.update(threads=count, read=True)
    apply(count)
    return count


def apply(count):  # -> None; OpenBLAS runs count threads outside a pass (a pass under way sets it when it ends)
    blas = openblas()
    with passes_lock:
        settings["applied"] = count
        if blas is None:
            return
        if passes["running"]:  # a pass under way keeps OpenBLAS on one thread; the last to end sets this count
            passes["n_threads"] = count
        else:
            blas[0](count)


@contextmanager
def all_cores(enabled=True):  # within: split() shares its pieces among threads() threads
    count = threads()  # read at every pass, long or not, so that OpenBLAS's count follows the free cores
    with one_pass(count if enabled else 0):
        yield


@contextmanager
def for_model(n_embd):  # within: a pass of a model n_embd wide; one narrower than NARROW runs on one thread
    with one_pass(1 if n_embd < NARROW else 0):
        yield


@contextmanager
def one_pass(size):  # within: OpenBLAS on one thread and a team of size threads; size 0: as it is
    # a pass in a pass keeps its team, and a pass on one thread where OpenBLAS already runs one sets nothing
    blas = openblas() if size and getattr(team, "size", None) is None and max(size, threads()) > 1 else None
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
        team.size, team.entered = size, True
        yield
    finally:
        team.__dict__.pop("size", None)
        team.__dict__.pop("entered", None)
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


def split(work, n_items, item_size=MIN_WORK, lead=0):  # work(piece) for contiguous slices that cover range(n_items),
    # one per thread; item_size: the elements (or multiply-adds) of one item, of which each thread gets MIN_WORK at
    # least; lead: items that the calling thread, the first piece's, takes beyond an even share, as long as every other
    # thread keeps one at least
    n_threads = min(team_size(), n_items, max(1, n_items * item_size // MIN_WORK))
    if n_threads <= 1:
        work(slice(0, n_items))
        return
    lead = min(lead, (n_items - n_threads) // n_threads)
    bounds = [0, *(lead + (n_items - lead) * i // n_threads for i in range(1, n_threads + 1))]
    pieces = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    if not pool_lock.acquire(blocking=False):  # the pool runs another thread's split (two passes at once) or this
        for piece in pieces:  # thread's own (a split within a piece): these pieces run here, one after another
            work(piece)
        return
    caller_cores = None
    try:
        others = helpers(team_size() - 1)[:n_threads - 1]
        caller_cores = keep_apart()
        for helper, piece in zip(others, pieces[1:]):
            helper.start(work, piece)
        try:
            work(pieces[0])  # the calling thread takes a piece too
        finally:
            errors = wait_for(others)  # every piece ends before the caller goes on, even if one raised
    finally:
        if caller_cores is not None:  # the caller free to move again
            with contextlib.suppress(OSError):  # (a core of its set gone offline meanwhile)
                os.sched_setaffinity(0, caller_cores)
        pool_lock.release()
    for error in errors:
        if error is not None:
            raise error  # a helper's exception


def wait_for(others):  # -> each helper's exception or None, once every one has ended its piece
    try:
        return [helper.wait() for helper in others]
    except BaseException:  # interrupted (Ctrl-C) while a helper may still run its piece: the next split gets a new pool
        release_pool()
        raise


class Helper:
    """A thread of the pool, handed one piece at a time through two bare locks: the caller sets the task and releases
    go, the thread releases done when the piece has ended: about 40 to 50 us a split less than a ThreadPoolExecutor's
    queue and futures took on 2 threads here, paid 49 times a token by a batch's step (making-it-fast.md)."""

    def __init__(self):
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.task, self.error = None, None
        thread = threading.Thread(target=self.run, name="gpt2_numpy", daemon=True)
        thread.start()
        self.native_id = thread.native_id  # the kernel's id of the thread, for keep_apart()

    def run(self):
        while True:
            self.go.acquire()
            if self.task is None:  # released from the pool
                return
            context, work, piece = self.task
            try:
                context.run(work, piece)
            except BaseException as error:  # raised in the caller
                self.error = error
            self.done.release()

    def start(self, work, piece):  # -> None; the piece runs in a copy of the caller's context, so that np.errstate (a
        # context variable) holds on this thread too
        self.task, self.error = (contextvars.copy_context(), work, piece), None
        self.go.release()

    def wait(self):  # -> the piece's exception, or None, once it has ended
        self.done.acquire()
        return self.error

    def stop(self):  # -> None; the thread ends once the piece it runs, if any, has ended (one not yet begun never runs)
        self.task = None
        if self.go.locked():  # else the thread has yet to take its piece, and finds none
            self.go.release()


COLUMNS, ROWS, INNER = "columns", "rows", "inner"  # how matmul() shares a product


def matmul(a, b, bias=None, over=COLUMNS, out=None):  # [n, k] @ [k, m] (+ bias [m]) -> [n, m] (in out if given), its
    # pieces shared by split()
    # Within all_cores() OpenBLAS runs one thread, so a product's pieces go to the team; outside, it is one product on
    # OpenBLAS's threads. over picks the pieces by what each thread reads: COLUMNS of the result, all of a and its
    # columns of b (a linear layer's x w: x is the smaller); ROWS, its rows of a and all of b (dwte = dlogitsᵀ x);
    # INNER, its part of k of both into a partial product of its own, the partials summed in order (dx = dlogits wte:
    # by columns every thread would read all of the [n, 50257] dlogits, by rows all of wte). The bias is added by
    # each piece while its output is in cache
    if over != INNER:
        return matmuls(Product(a, b, bias, over, out))[0]
    n, k, m = a.shape[0], a.shape[1], b.shape[1]
    out = np.empty((n, m), np.result_type(a, b)) if out is None else out
    partials = {}

    def inner(piece):  # the first piece's partial goes to out, each other's to an array of its own
        partials[piece.start] = np.matmul(a[:, piece], b[piece], out=out if piece.start == 0 else None)

    split(inner, k, item_size=n * m)  # a step of k: n x m multiply-adds
    for start in sorted(partials)[1:]:
        out += partials[start]
    if bias is not None:
        out += bias
    return out


class Product(NamedTuple):
    """One product for matmuls(): a [n, k] @ b [k, m] (+ bias [m]), shared by ROWS or COLUMNS, in out if given."""
    a: np.ndarray
    b: np.ndarray
    bias: Optional[np.ndarray] = None
    over: str = COLUMNS
    out: Optional[np.ndarray] = None

    def length(self):  # -> the rows or columns its pieces share
        return self.a.shape[0] if self.over == ROWS else self.b.shape[1]


def matmuls(*products):  # Product, ... -> [a @ b + bias of each]
    # Products that need not wait for each other (a linear layer's dx and dw), in one split(): a team no larger than
    # their count runs each whole on one thread, the form OpenBLAS runs fastest, with one hand-over for all; a larger
    # team, an equal number of pieces of each
    outs = [np.empty((p.a.shape[0], p.b.shape[1]), np.result_type(p.a, p.b)) if p.out is None else p.out
            for p in products]
    work = sum(p.a.shape[0] * p.a.shape[1] * p.b.shape[1] for p in products)  # multiply-adds
    # split()'s rule for its threads: no more than the team, the work's MIN_WORKs, or any product's rows or columns
    per_product = max(1, min(team_size(), work // MIN_WORK, *(p.length() for p in products)) // len(products))

    def some_pieces(share):
        for at in range(share.start, share.stop):
            product, out = products[at // per_product], outs[at // per_product]
            i, length = at % per_product, product.length()
            piece = slice(length * i // per_product, length * (i + 1) // per_product)
            by_rows = product.over == ROWS
            part = (piece, slice(None)) if by_rows else (slice(None), piece)
            np.matmul(product.a[piece] if by_rows else product.a, product.b if by_rows else product.b[:, piece],
                      out=out[part])
            if product.bias is not None:
                out[part] += product.bias[part[1]]

    n_pieces = len(products) * per_product
    split(some_pieces, n_pieces, item_size=work // n_pieces)
    return outs


def helpers(n):  # -> the pool's n threads, the last pool's stopped if it had another size (call with pool_lock held)
    if pool["size"] != n:  # a count that changes (set_threads, the free cores) leaves no idle pool behind
        release_pool()
        pool.update(size=n, helpers=[Helper() for _ in range(n)])
    return pool["helpers"]


def release_pool():  # -> None; the pool's threads end, each once its piece, if any, has ended
    for helper in pool["helpers"]:
        helper.stop()
    pool.update(size=0, helpers=[])
    placement["apart"] = None


def keep_apart():  # -> the cores the caller may run on, now kept on the one it runs on until its split ends, the
    # pool's threads off that core (call with pool_lock held); None: the threads stay where the scheduler puts them
    # A kernel that packs a virtual machine's threads onto its vCPUs already running (the project's machines:
    # /proc/sys/kernel/sched_vcpu_pack) wakes a thread after a pause on the core of the thread that woke it: a helper on
    # its caller's, or the caller, waiting for the GIL, on its helper's. The split's pieces then run there one after the
    # other until the scheduler parts the threads some 20 ms later (measured: the first three steps of a 2-thread SAE
    # run after a quarter-second sleep took 1.5x as long). Elsewhere this changes nothing: each thread runs a piece
    # meanwhile. Only for the split: kept for a whole pass, the caller could not leave a core that turns busy between
    # splits (a batch of 8's generate then ran 10% slower). About 3 us a split: three system calls, the pool's
    # threads' only when the caller's core differs from the last split's
    cpu = current_cpu()
    if cpu is None or placement["off"]:
        return None
    try:
        allowed = os.sched_getaffinity(0)
        if len(allowed) < 2:  # one core to run on: nowhere else to go
            return None
        os.sched_setaffinity(0, {cpu})
        try:
            if placement["apart"] != (cpu, allowed):
                placement["apart"] = None  # until every helper is placed
                for helper in pool["helpers"]:
                    os.sched_setaffinity(helper.native_id, allowed - {cpu})
                placement["apart"] = cpu, allowed
        except OSError:
            os.sched_setaffinity(0, allowed)
            raise
    except OSError:  # a sandbox that forbids it: the threads go where the scheduler puts them, from now on
        placement["off"] = True
        return None
    return allowed


def current_cpu():  # -> the core the calling thread runs on now, or None where it cannot be read (macOS, Windows)
    getcpu = sched_getcpu()  # one lookup: this runs at every split
    cpu = getcpu() if getcpu is not None else -1
    return cpu if cpu >= 0 else None  # -1: the C library could not tell


@functools.cache
def sched_getcpu():  # -> the C library's sched_getcpu, or None where there is none or no way to set affinity
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu  # the process's own symbols, which include its C library's
    except (OSError, AttributeError, TypeError):
        return None
    getcpu.restype = ctypes.c_int
    return getcpu


def after_fork_in_child():  # -> None; the child has none of its parent's threads, and so none of their passes
    global passes_lock, pool_lock
    pool.update(size=0, helpers=[])  # the parent's pool has no threads here: its pieces would wait forever
    placement["apart"] = None
    pool_lock = threading.Lock()
    # The forking thread's own pass, if any, goes on in the child and ends there. Another thread of the parent's was
    # inside a pass, or held the lock (so the count may be set but not yet counted): no pass of the child's will end
    # those, and the held lock would never be released, so the count from before them is the child's now.
    own = 1 if getattr(team, "entered", False) else 0
    if (passes["running"] > own or passes_lock.locked()) and not own and passes["n_threads"] is not None:
        openblas()[0](passes["n_threads"])
    passes_lock = threading.Lock()
    passes["running"] = own


os.register_at_fork(after_in_child=after_fork_in_child)
