"""Fuzz the checkpoint readers: seeded random damage to the fixtures, each damaged file loaded and judged.

The mutations and the rule each outcome must obey live in scripts/common/fuzzing/, shared with
tests/hostile/test_fuzz_formats.py (a fixed number of cases, in CI). Every case is reproducible from its format,
seed and number:
    python -m scripts.dev.fuzz_formats --cases 100000                 # both formats, 100,000 cases each
    python -m scripts.dev.fuzz_formats --format tf --seed 3 --case 4242 # one case again, with its description
Run long fuzzing under `nice -n 10` on a shared machine. Exit status 1 when any case failed.
"""
import argparse
import resource
import signal
import sys
import tempfile
import time
from collections import Counter

from gpt2_numpy.commands.common import whole_number
from scripts.common.fuzzing.fixtures import FORMATS
from scripts.common.fuzzing.runner import Runner, cases

RUNAWAY_SECONDS = 10  # a case still running after this is stopped and counted as a failure, so the run goes on
MEMORY_CAP = 4 * 2**30  # address space: a runaway allocation becomes a MemoryError (a failure) instead of swapping


class Runaway(BaseException):  # not an Exception: the runner's own handler must not take it for a loader's error
    pass


def stop_runaway(signum, frame):
    raise Runaway


def run_guarded(runner, case):  # -> (outcome, None or what went wrong), with runaway cases stopped
    signal.setitimer(signal.ITIMER_REAL, RUNAWAY_SECONDS)
    try:
        return runner.run(case)
    except Runaway:
        return "runaway", (f"case {case.number}: {case.target.fixture.name}/{case.target.name} {case.description}: "
                           f"still running after {RUNAWAY_SECONDS} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def fuzz(runner, fmt, n_cases, seed, only=None, report_every=10_000):  # -> list of failure lines
    failures, outcomes, start = [], Counter(), time.perf_counter()
    for case in cases(fmt, n_cases, runner, seed):
        if only is not None and case.number != only:
            continue
        outcome, problem = run_guarded(runner, case)
        outcomes[case.target.fixture.name, case.target.name, case.mutation, outcome] += 1
        if problem:
            failures.append(problem)
            print(f"FAIL {fmt} {problem}", flush=True)
        elif only is not None:
            print(f"{outcome} {fmt} case {case.number}: {case.target.fixture.name}/{case.target.name} "
                  f"{case.description}")
        done = case.number + 1
        if only is None and done % report_every == 0:
            print(f"{fmt}: {done:,} cases, {len(failures)} failures, {time.perf_counter() - start:.0f} s", flush=True)
    print_table(outcomes)
    seconds = time.perf_counter() - start
    print(f"{fmt}: {sum(outcomes.values()):,} cases in {seconds:.1f} s, {len(failures)} failures", flush=True)
    return failures


def print_table(outcomes):  # per fixture file and mutation: how many cases loaded, were refused, crashed
    rows = sorted({key[:3] for key in outcomes})
    print(f"{'file':<36} {'mutation':<16} {'loaded':>8} {'refused':>8} {'other':>6}")
    for fixture, name, mutation in rows:
        loaded, refused = outcomes[fixture, name, mutation, "arrays"], outcomes[fixture, name, mutation, "error"]
        other = sum(count for key, count in outcomes.items() if key[:3] == (fixture, name, mutation)) - loaded - refused
        print(f"{fixture + '/' + name:<36} {mutation:<16} {loaded:>8,} {refused:>8,} {other:>6,}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=whole_number(1), default=10_000, help="cases per format (default 10,000)")
    parser.add_argument("--format", choices=sorted(FORMATS), action="append", help="only this format (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random cases (default 0)")
    parser.add_argument("--case", type=whole_number(0), help="run only the case with this number")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, stop_runaway)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, resource.getrlimit(resource.RLIMIT_AS)[1]))
    failures = []
    with tempfile.TemporaryDirectory(prefix="fuzz-formats-") as workdir, Runner(workdir) as runner:
        for fmt in args.format or sorted(FORMATS):
            n_cases = args.cases if args.case is None else args.case + 1
            failures += fuzz(runner, fmt, n_cases, args.seed, args.case)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
