"""Speed and memory of gpt2_numpy on the GPT-2 124M shape, optionally side by side with Hugging Face transformers, and
the goals they are held to. Run from the repo root:

    python -m scripts.benchmark                          # our numbers only (numpy, regex, requests, tqdm)
    python -m scripts.benchmark --compare-hf             # also HF transformers on the same weights, in this process
    python -m scripts.benchmark --only prefill decode    # some parts only
    python -m scripts.benchmark --markdown docs/performance.md   # also write the tables into that page
    python -m scripts.benchmark --json                   # the rows and verdicts as JSON instead of tables
    python -m scripts.benchmark --threads 1 2 4          # every part at each thread count: a table per part
    python -m scripts.benchmark --busy 1                 # every part idle, then beside 1 CPU-bound process

The weights are a TF checkpoint when `--checkpoint DIR` (default weights/124M) holds one (the real one, or a 124M-shaped
one from `python -m scripts.fixtures.make_tf_fixture --config 124M --out DIR`), else seeded random weights of the 124M
shape. `--compare-hf` needs `pip install torch==2.13.0 transformers safetensors` (CPU torch); HF runs with its default
attention (sdpa) and as many torch threads as NumPy's BLAS uses; `--threads N ...` runs the parts once per count, with
ours (gpt2_numpy.cores.set_threads), NumPy's BLAS and torch all given that count. Each time is the median of
`--repeats` runs after a warm-up; where both engines run, they take turns, repeat by repeat. The goals
(scripts/bench/goals.py) are ratios measured in one run, judged at each thread count (without --threads, at the count
in force); a sweep also lists each row of ours that got slower when the count doubled. `--busy N` runs every part
twice, first as the machine is, then with N CPU-bound processes of its own beside it (scripts/bench/busy.py: each ends
when the run does, however it ends), and prints the two side by side; the "default count" part times the default
thread count against one thread. At the start, a machine already busy (load average above its cores) gets a note
line on stderr: its figures are not an idle machine's. The test suite asserts no timings. Each part lives in a module
of scripts/bench.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
from collections import namedtuple
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpt2_numpy import keep_freed_memory
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.params import random_params
from gpt2_numpy.console import plural
from scripts.bench import (batch, bpe, breakdown, busy, circuits, counts, forward, goals, memory, roofline, sae, score,
                           tokenizer, train)
from scripts.bench.engines import INSTALL_HF, HuggingFace, Ours
from gpt2_numpy import cores
from scripts.bench.harness import (BEGIN, END, HF, HPARAMS_124M, REPO, blas_name, blas_threads, cpu_name, fail,
                                   read_page, report, sweep_report, vocabulary, write_between_markers)

Run = namedtuple("Run", "engines params tf_dir hf_dir vocab_dir repeats corpus circuit_tracer_python")
PARTS = {  # --only's names, in the order they run -> (run) -> rows (the breakdown: its own table's lines)
    "prefill": lambda run: forward.prefill_rows(run.engines, run.repeats),
    "decode": lambda run: forward.decode_rows(run.engines, run.repeats),
    "batched generate": lambda run: batch.batch_rows(run.engines, run.repeats),
    "score": lambda run: score.score_rows(run.engines, run.vocab_dir, run.repeats),
    "einsum": lambda run: forward.einsum_rows(run.repeats),
    "tricks": lambda run: forward.trick_rows(run.params, run.repeats),
    "threads": lambda run: forward.piece_rows(run.params, run.repeats),
    "load": lambda run: memory.load_rows(run.tf_dir, run.hf_dir, run.repeats),
    "allocator": lambda run: memory.allocator_rows(run.tf_dir, run.repeats),
    "peak memory": lambda run: memory.peak_rss_rows(run.tf_dir, run.hf_dir),
    "CRC32C": lambda run: [memory.crc_row(run.tf_dir, run.repeats)],
    "tokenizer": lambda run: tokenizer.tokenizer_rows(run.vocab_dir, run.repeats),
    "BPE training": lambda run: bpe.bpe_rows(run.repeats, run.corpus),
    "breakdown": lambda run: breakdown.breakdown_lines(run.engines),
    "training": lambda run: train.train_rows(run.repeats, compare_torch=bool(run.hf_dir), theirs=HF)[0],
    "default count": lambda run: counts.default_rows(run.params, run.engines[0].n_head, run.repeats),
    "sae": lambda run: sae.sae_rows(run.repeats, theirs=HF),  # SAELens's trainer where sae-lens is installed
    # circuit-tracer's attribute() where its venv is (--circuit-tracer-python); a run of each takes minutes
    "circuits": lambda run: circuits.graph_rows(run.repeats, python=run.circuit_tracer_python, theirs=HF)[0],
}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare-hf", action="store_true", help="also run HF transformers on the same weights")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--markdown", type=Path, metavar="FILE",
                        help=f"also write the tables into FILE, in place of what stands between its {BEGIN} and {END} "
                        "lines; the rest of FILE stays as it is (with --only, the tables hold those parts' rows alone)")
    parser.add_argument("--checkpoint", type=Path, default=REPO / "weights" / "124M",
                        help="a TF checkpoint dir of the 124M shape (default: %(default)s); without one, seeded random "
                        "weights of that shape, no TF load rows, and CRC32C on random bytes")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement, of which the median counts")
    parser.add_argument("--circuit-tracer-python", type=Path, default=circuits.PEER_PYTHON, metavar="PYTHON",
                        help="the circuits part's peer: python of a venv with circuit-tracer (default: %(default)s)")
    parser.add_argument("--corpus", type=Path, default=bpe.CORPUS, metavar="FILE",
                        help="the text the BPE training part trains on (default: %(default)s)")
    parser.add_argument("--threads", nargs="+", type=int, metavar="N",
                        help="run the parts at each of these thread counts (ours, NumPy's BLAS and torch alike), and "
                        "print a table per part with a column per count; counts above this machine's cores "
                        "oversubscribe it (default: one run at the count in force)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="run every part twice: as the machine is, then beside N CPU-bound processes, which end "
                        f"with the run (or after {busy.BUSY_SECONDS:,} s at most); a column for each")
    parser.add_argument("--only", nargs="+", choices=PARTS, metavar="PART",
                        help=f"run only these parts: {', '.join(PARTS)} (default: all); score needs --compare-hf, load "
                        "and peak memory a TF checkpoint or --compare-hf")
    return parser.parse_args(argv)


def engines_for(params, hparams, compare_hf, scratch):  # -> engines, and HF's folder of the same weights if compared
    engines = [Ours(params, hparams["n_head"])]
    if not compare_hf:
        return engines, None
    try:
        engines.append(HuggingFace(params, hparams))
    except ImportError as error:
        fail(f"--compare-hf needs HF transformers, and {error} is missing: {INSTALL_HF}")
    hf_dir = Path(scratch) / "hf"
    engines[1].model.save_pretrained(hf_dir)  # the same weights as safetensors, for the load and memory rows
    return engines, hf_dir


def check_args(args, tf_dir):  # -> None; one error line for a run that would measure nothing
    if args.repeats < 1:
        fail(f"--repeats {args.repeats}: a median needs at least 1 run")
    if any(count < 1 for count in args.threads or ()):
        fail(f"--threads {' '.join(map(str, args.threads))}: each count must be a whole number >= 1")
    if args.busy < 0:
        fail(f"--busy {args.busy}: the CPU-bound processes to start must be a whole number >= 0")
    without = {"score": "--compare-hf", "load": "--compare-hf or a TF checkpoint (--checkpoint)",
               "peak memory": "--compare-hf or a TF checkpoint (--checkpoint)"}
    measured = {"score": args.compare_hf, "load": args.compare_hf or tf_dir, "peak memory": args.compare_hf or tf_dir}
    for name in args.only or ():
        if name in without and not measured[name]:
            fail(f"--only {name} measures nothing without {without[name]}")
    if "BPE training" in (args.only or PARTS):  # else a child's traceback, 20 minutes into the run
        try:
            args.corpus.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            fail(f"--corpus {args.corpus}: {getattr(error, 'strerror', None) or error}; the BPE training part trains "
                 "on this UTF-8 text: pass another, or choose other parts with --only")


def main(argv=None):
    args = parse_args(argv)
    tf_dir = args.checkpoint if (args.checkpoint / "model.ckpt.index").exists() else None
    check_args(args, tf_dir)
    if args.markdown:
        read_page(args.markdown)  # now, not after a run of half an hour
    load = busy.note_if_busy()  # before anything of ours runs
    keep_freed_memory()  # as the CLIs do; both engines share this process and its allocator
    hparams, params = load_params(tf_dir) if tf_dir else (HPARAMS_124M, random_params(HPARAMS_124M))
    counts = args.threads or [None]  # None: the count in force, once
    loads = [0, args.busy] if args.busy else [0]
    runs, rates = {}, {}  # column label -> {part: rows}, and the rates its rows' bounds come from
    with tempfile.TemporaryDirectory() as scratch:
        engines, hf_dir = engines_for(params, hparams, args.compare_hf, scratch)
        run = Run(engines, params, tf_dir, hf_dir, vocabulary(args.checkpoint), args.repeats, args.corpus,
                  args.circuit_tracer_python)
        threads_in_force = threads_line(engines)  # before any part: a pass may change OpenBLAS's count
        names = [name for name in PARTS if name in (args.only or PARTS)]
        with tqdm(total=len(names) * len(counts) * len(loads), desc="benchmark", unit="part",
                  file=sys.stderr) as progress:
            for n_busy in loads:
                with busy.processes(n_busy):
                    for count in counts:  # a full run takes half an hour: the bar on stderr counts the parts
                        if count is not None:
                            use_threads(count, engines)
                        label = column(count, n_busy, args.busy)
                        runs[label] = {}
                        for name in names:
                            progress.set_postfix_str(", ".join(filter(None, [name, label])))
                            runs[label][name] = PARTS[name](run)
                            progress.update()
                        if any(map(roofline.bounded, part_rows(runs[label]))):  # on the same cores, count and load
                            rates[label] = roofline.measured_rates()
    torch = f", torch {engines[1].torch.__version__}" if hf_dir else ""
    header = {
        "cpu": f"{cpu_name()}, {os.cpu_count()} cores ({cores.available_cores()} for this process), "
               f"{platform.machine()}",
        "kernels": f"NumPy's BLAS {blas_name()}" + (f", torch's {torch_isa(engines[1].torch)}" if hf_dir else ""),
        "threads": threads_in_force if args.threads is None else ", ".join(  # a column per count
            f"{count}" + (" (oversubscribed)" if count > cores.available_cores() else "") for count in args.threads),
        "load": f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} at the start",
        "versions": f"Python {platform.python_version()}, numpy {np.__version__}{torch}",
        "weights": f"checkpoint {tf_dir}" if tf_dir else "seeded random weights of the 124M shape (no TF checkpoint)",
    }
    if args.busy:
        header["busy"] = f"{args.busy} CPU-bound process{'es' if args.busy > 1 else ''} beside the run (busy column)"
    breakdowns = {label: results.pop("breakdown", []) for label, results in runs.items()}
    names = [e.name for e in engines]
    rows = {label: roofline.with_bounds(part_rows(results), rates.get(label)) for label, results in runs.items()}
    bounds = {label: roofline.bound_lines(rows[label], rates[label], names) for label in rates}
    count_of = {column(count, n_busy, args.busy): count for n_busy in loads for count in counts}
    met = {label: goals.verdicts(label_rows, count_of[label] or cores.threads()) for label, label_rows in rows.items()}
    if args.threads or args.busy:
        by_count = {column(None, n_busy, args.busy): {count: rows[column(count, n_busy, args.busy)] for count in counts}
                    for n_busy in loads}  # "" without --busy
        monotone = {(f"{goals.MONOTONE[:-1]}, {load_label}:" if load_label else goals.MONOTONE):
                    goals.monotone_lines(load_rows)
                    for load_label, load_rows in by_count.items()} if args.threads else {}
        where = {f"Where our time goes, {label}:": breakdowns[label] for label in runs}
        bounded = {f"Each row against this machine's bound, {label}:": lines for label, lines in bounds.items()}
        title = "Goals, a row per thread count:" if not args.busy else "Goals, a row per column:"
        tables = sweep_report(header, runs, names, {title: goals.sweep_goal_table(met), **monotone, **bounded,
                                                    **where})
        columns = {label: {"rows": rows[label], "goals": met[label], "breakdown": breakdowns[label],
                           "rates": rates_json(rates.get(label))} for label in runs}
        if args.busy:
            data = {"header": header, "columns": columns}
        else:  # a column per count, keyed by the count
            data = {"header": header, "threads": dict(zip(map(str, counts), columns.values()))}
        if args.threads and goals.doublings(counts):  # ours, by more than goals.WITHIN, from a count to its double
            slower = {load_label: goals.slower(load_rows) for load_label, load_rows in by_count.items()}
            data["slower"] = slower if args.busy else slower[""]
    else:
        label = column(None, 0, 0)
        tables = report(header, rows[label], names, {"Goals:": goals.goal_table(met[label]),
                                                     "Each row against this machine's bound:": bounds.get(label),
                                                     "Where our time goes:": breakdowns[label]})
        data = {"header": header, "rows": rows[label], "goals": met[label], "breakdown": breakdowns[label],
                "rates": rates_json(rates.get(label))}
    print(json.dumps(data, indent=2) if args.json else tables)
    if args.markdown:
        write_between_markers(args.markdown, tables)


def part_rows(results):  # {part: rows} -> the rows of every part but the breakdown (lines of its own table)
    return [r for part, part_rows in results.items() if part != "breakdown" for r in part_rows]


def rates_json(rates):  # -> {"read_bytes_per_s", "gemm_flops_per_s"}, or None where no row had a bound
    return rates and {"read_bytes_per_s": rates.read, "gemm_flops_per_s": rates.gemm}


def threads_line(engines):  # -> "ours 2, NumPy's BLAS 2, torch 2": the counts in force
    counts = [f"ours {cores.threads()}", f"NumPy's BLAS {blas_threads()}"]
    counts += [f"torch {engine.torch.get_num_threads()}" for engine in engines[1:]]
    return ", ".join(counts)


def torch_isa(torch):  # -> "AVX512 kernels": the instructions torch's CPU kernels use here
    return f"{torch.backends.cpu.get_cpu_capability()} kernels"


def column(count, n_busy, busy_asked):  # -> "2 threads, busy 1": a table column's label ("" for one plain run)
    load = ("idle" if n_busy == 0 else f"busy {n_busy}") if busy_asked else None
    return ", ".join(filter(None, [plural(count, "thread") if count else None, load]))


def use_threads(count, engines):  # -> None; ours, NumPy's BLAS, torch and any fresh process a part starts: count
    cores.set_threads(count)
    os.environ[cores.THREADS_VARIABLE] = str(count)  # the parts' fresh processes (peak memory, the allocator)
    for engine in engines[1:]:
        engine.torch.set_num_threads(count)  # training's torch_step sets it again from blas_threads(), the same


if __name__ == "__main__":
    main()
