"""The benchmark's timing harness: engines taking turns, the inputs every part shares, rows and the markdown table they
make, and the markers between which --markdown writes it into a page."""
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gpt2_numpy import cores
from gpt2_numpy.disk import atomic_write
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY

REPO = Path(__file__).resolve().parents[2]
HPARAMS_124M = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}
OURS, HF, TEXTBOOK = "gpt2_numpy", "HF transformers", "textbook model.py"
BEGIN, END = "<!-- benchmark:begin -->", "<!-- benchmark:end -->"


# --- timing ---


SETTLE_SECONDS = 0.25  # a pause before each turn of in_turns, longer than OpenBLAS's spin after a product


def in_turns(measures, repeats, warm_up=True):  # {name: measure() -> seconds} -> {name: median seconds}
    # the engines take turns, repeat by repeat, so a machine that speeds up or slows down mid-row (timings here drift
    # by 15% and more) moves both engines' medians alike, and their ratio holds
    # Each turn after another's starts on idle cores: OpenBLAS's workers spin on their cores for about 0.1 s after a
    # product (measured: 0.11 s of CPU in a 0.3 s sleep after one), and a turn timed meanwhile would share its cores
    # with them, which no single run of that engine meets
    settle = SETTLE_SECONDS if len(measures) > 1 else 0
    for measure in measures.values() if warm_up else ():  # none for runs of minutes, which a first run barely slows
        measure()  # warm-up
    times = {name: [] for name in measures}
    for _ in range(repeats):
        for name, measure in measures.items():
            time.sleep(settle)
            times[name].append(measure())
    return {name: float(np.median(t)) for name, t in times.items()}


def wall_seconds(run):  # -> a measure for in_turns: the wall time of one run()
    def measure():
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    return measure


def median_seconds(run, repeats):  # -> median wall time of run() after one warm-up call
    return in_turns({"run": wall_seconds(run)}, repeats)["run"]


def blas_threads():  # the threads NumPy's BLAS uses: OpenBLAS's own count, else the variables it honours, or every core
    if cores.openblas():
        return cores.blas_threads()
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(variable):
            return int(os.environ[variable])
    return os.cpu_count()


def blas_name():  # -> "scipy-openblas 0.3.31 (SkylakeX kernels)": its kernels decide which few-row product is faster
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    core = cores.openblas_core()
    return f"{blas.get('name')} {blas.get('version', '')}".strip() + (f" ({core} kernels)" if core else "")


def cpu_name():  # -> "AMD EPYC (AVX-512)": the CPU's model name and its widest vector instructions, from Linux's
    # /proc/cpuinfo (OpenBLAS and torch pick their kernels by those instructions); elsewhere what platform knows
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)  # the last core's, the same as the first's
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    isa = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX")) if flag in flags),
               None)
    return fields.get("model name", platform.machine()) + (f" ({isa})" if isa else "")


# Peak memory of a whole process: parts run a script in a fresh process per case, with this function in it. VmHWM, not
# ru_maxrss: Linux carries ru_maxrss over from the parent at fork, so a child would report our own peak.
PEAK_RSS_BYTES = """
def peak_rss_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
"""


def fresh_process(script, *args):  # -> stdout of `python -c script args` in a new process, from the repo root
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, check=True,
                          cwd=REPO).stdout


# --- inputs ---


def prompt_ids(n):  # a fixed pseudo-random prompt of n ids
    return np.random.default_rng(0).integers(0, HPARAMS_124M["n_vocab"], n).tolist()


def vocabulary(checkpoint):  # -> the folder with GPT-2's encoder.json and vocab.bpe: the checkpoint's, or our copy
    return checkpoint if (checkpoint / "encoder.json").exists() else PACKAGED_VOCABULARY


def batch_prompts(lengths):  # -> one fixed pseudo-random prompt per length, each different
    rng = np.random.default_rng(1)
    return [rng.integers(0, HPARAMS_124M["n_vocab"], n).tolist() for n in lengths]


# --- rows and tables ---


def row(metric, better, values, pair=None):  # values: {engine or column name: number}; pair: the two names whose
    # ratio the row's tables show, where they are not the engines (ours and HF's)
    return {"metric": metric, "better": better, **values, **({"pair": pair} if pair else {})}


def comparison_table(rows, names):  # -> markdown lines: a column per name, the ratio of the first two, then the rest
    if not rows:
        return []
    extra = sorted({key for r in rows for key in r} - {"metric", "better", "pair", "bound", *names})  # e.g. tiktoken
    # (a row's bound: roofline.py's table)
    paired = len(names) == 2 or any("pair" in r for r in rows)  # a ratio column
    columns = ["metric", *names, *extra] + ([f"{names[0]} / {names[1]}" if len(names) == 2 else "ratio"] if paired
                                            else [])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [r["metric"]] + [f"{r[n]:,.3g}" if r.get(n) is not None else "" for n in (*names, *extra)]
        if paired:
            pair = r.get("pair", names)
            cells.append(ratio(r, *pair) if len(pair) == 2 else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ratio(r, ours, theirs):  # "0.62× (better)": ours / theirs, and whether that is the good side of 1
    if r.get(ours) is None or r.get(theirs) is None:
        return ""
    value = r[ours] / r[theirs]
    better = value > 1 if r["better"] == "higher" else value < 1
    return f"{value:.2f}× ({'better' if better else 'worse'})"


def report(header, rows, names, sections):  # -> markdown: the setting, the table, then sections ({title: lines})
    return "\n".join(setting_lines(header) + with_titles({"": comparison_table(rows, names), **sections}))


def sweep_report(header, runs, names, sections):  # -> markdown: the setting, then a table per part with a column per
    # run (runs: {column label: {part: rows}}: "2 threads", "busy 1"), then sections ({title: lines}: the goals, where
    # time goes)
    lines = setting_lines(header)
    counts = list(runs)
    for part in runs[counts[0]]:
        by_count = [{r["metric"]: r for r in runs[count][part]} for count in counts]
        pairs = {tuple(r.get("pair", names)) for r in runs[counts[0]][part]}  # a part's own pair, where it has one
        pair = pairs.pop() if len(pairs) == 1 else names
        cell = f"{pair[0]} / {pair[1]} (ratio)" if len(pair) == 2 else pair[0]
        lines += ["", f"{part}, {cell}:", "", "| metric | " + " | ".join(counts) + " |",
                  "|---|" + "---|" * len(counts)]
        for metric in by_count[0]:
            cells = [sweep_cell(rows.get(metric), names) for rows in by_count]
            lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines + with_titles(sections))


def setting_lines(header):  # -> the machine, versions and weights, in a code block
    return ["```", *(f"{key}: {value}" for key, value in header.items()), "```"]


def with_titles(sections):  # -> markdown lines: each section with lines after a blank line, under its title if any
    lines = []
    for title, table in sections.items():
        if table:  # a section only where the parts that ran measured something for it
            lines += [""] + ([title, ""] if title else []) + table
    return lines


def sweep_cell(r, names):  # -> "1.66 / 1.84 (0.90× (better))", or ours alone
    if r is None:
        return ""
    names = r.get("pair", names)
    values = [f"{r[name]:,.3g}" for name in names if r.get(name) is not None]
    return " / ".join(values) + (f" ({ratio(r, *names)})" if len(values) == 2 else "")


# --- the page --markdown writes into ---


def fail(message):  # one line on stderr, and the exit status of a bad argument
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def between_markers(page, tables):  # -> page with tables in place of what stood between its markers; None if none
    start = page.find(BEGIN)
    end = page.find(END, start + len(BEGIN)) if start >= 0 else -1
    if end < 0:
        return None
    return page[:start + len(BEGIN)] + "\n" + tables + "\n" + page[end:]


def read_page(path):  # -> the text of the page, which must hold the two markers
    try:
        page = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as error:
        fail(f"cannot read --markdown {path}: {getattr(error, 'strerror', None) or error}")
    if between_markers(page, "") is None:
        fail(f"--markdown {path} has no {BEGIN} ... {END} pair: add the two lines where the tables go")
    return page


def write_between_markers(path, tables):  # the page read again, as it may have changed during the run
    page = between_markers(read_page(path), tables)
    try:
        atomic_write(path, lambda file: file.write(page.encode("utf-8")))
    except OSError as error:
        fail(f"cannot write --markdown {path}: {error.strerror or error} (the tables are printed above)")
