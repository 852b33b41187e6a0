"""A busy machine for the benchmark's --busy N: N CPU-bound processes beside the run, and the note at the start when
the machine is busy already.

Each process spins in pure Python until the run ends: the benchmark ends it by its PID when the run ends or fails,
Ctrl-C included (each runs in a session of its own, so that the terminal's Ctrl-C reaches only the benchmark, which
then ends them), and each ends by itself after BUSY_SECONDS, or as soon as its parent is gone (a benchmark killed with
SIGKILL, whose cleanup never runs)."""
import os
import subprocess
import sys
from contextlib import contextmanager

from gpt2_numpy import cores

BUSY_SECONDS = 3600  # longer than a full run of every part, idle and busy
SPIN = """
import os, sys, time
parent, end = int(sys.argv[2]), time.monotonic() + float(sys.argv[1])  # a parent gone before this line ran counts
while time.monotonic() < end and os.getppid() == parent:  # a check every few tens of microseconds of work
    sum(range(1000))
"""


@contextmanager
def processes(n):  # within: n CPU-bound processes run beside this one; -> their PIDs
    started = []
    try:
        for _ in range(n):
            started.append(subprocess.Popen([sys.executable, "-c", SPIN, str(BUSY_SECONDS), str(os.getpid())],
                                            stdin=subprocess.DEVNULL, start_new_session=True))
        if started:
            print(f"busy: {n} CPU-bound process{'es' if n > 1 else ''} beside the run, PID "
                  f"{', '.join(str(process.pid) for process in started)}", file=sys.stderr, flush=True)
        yield [process.pid for process in started]
    finally:
        for process in started:
            process.kill()  # by its PID, which is still ours: it cannot have been reaped before this wait
        for process in started:
            process.wait()


def note_if_busy():  # -> the load averages; a note line on stderr where the 1-minute one exceeds this process's cores
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    if load[0] > cores.available_cores():
        print(f"note: the machine is busy already (load average {load[0]:.2f} on {cores.available_cores()} cores): "
              "these are not an idle machine's figures", file=sys.stderr, flush=True)
    return load
