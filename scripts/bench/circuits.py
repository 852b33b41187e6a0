"""Attribution-graph speed: gpt2_numpy's `attribution_graph` (gpt2_numpy/circuits/graph.py) against circuit-tracer's
`attribute()` on the same random GPT-2, transcoders and prompt, torch on as many threads as NumPy's BLAS uses.

    python -m scripts.bench.circuits                  # GPT-2 124M's shape, 12 transcoders of 24,576 features, 64 tokens
    python -m scripts.bench.circuits --layers 4 --width 256 --features 2048 --tokens 32 --max-features 512  # a try

The weights are random_params's, seeded, of the shape asked for (GPT-2's vocabulary); the transcoders are drawn here,
seeded: one per layer, reading `ln2.hook_normalized` and writing `hook_mlp_out`, JumpReLU with thresholds drawn from 2.5
to 2.8 on pre-activations of about N(0, 1), so that about 4 of every 1,000 features fire at each position (about 100 of
24,576 per layer and position, as trained sets have); no skip connection. The prompt is fixed pseudo-random ids after
`<|endoftext|>`. Ours runs `attribution_graph(..., max_features=N)`, circuit-tracer `attribute(..., max_feature_nodes=N,
batch_size=PEER_BATCH)`, ranking after every 2,048 traced as ours and its defaults do (update_interval 16 x 128, not 4 x
512: its forward pass is batch_size copies of the prompt, which at 512 held 18 GB and was killed on a 24 GB machine), in
a process of its own with circuit-tracer's venv's python (--circuit-tracer-python, default ../ref-ct/bin/python beside
the clone; scripts/bench/circuit_tracer_peer.py); the two take turns, repeat by repeat, without a warm-up (a run takes
minutes), and only one computes at a time. Each time covers the whole graph: the forward pass, the features, the ranking
and the rows. After the runs, the two graphs are compared: the same selected features (but for near-ties in the ranking:
at most SELECTED_APART of them), and the adjacency over the nodes both have within CHECK_RTOL of its largest entry, so
that the times are of the same work (the thresholds are kept MARGIN clear of the prompt's pre-activations, so that
float32's rounding cannot switch a feature on in one engine alone).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import namedtuple
from pathlib import Path

import numpy as np

from gpt2_numpy import keep_freed_memory
from gpt2_numpy.sae.transcoder_files import save_transcoders
from gpt2_numpy.circuits.graph import QUEUE, attribution_graph, layer_input
from gpt2_numpy.sae.transcoder_model import TranscoderSet, pre_activations
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.params import random_params
from gpt2_numpy.save import save_model
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY
from scripts.bench.harness import HPARAMS_124M, OURS, REPO, blas_threads, comparison_table, in_turns, row

CIRCUIT_TRACER = "circuit-tracer"
PEER_PYTHON = REPO.parent / "ref-ct" / "bin" / "python"  # make_graph_reference.py's venv
INSTALL = "python3 -m venv ../ref-ct && ../ref-ct/bin/pip install torch==2.13.0 circuit-tracer"
Shape = namedtuple("Shape", "n_layer n_embd n_head d_transcoder n_tokens max_features")
SHAPE_124M = Shape(12, 768, 12, 24576, 64, 4096)  # issue 57's measure
THRESHOLDS = (2.5, 2.8)  # P(N(0, 1) > 2.5..2.8): 6.2 to 2.6 per 1,000
CHECK_RTOL = 1e-3  # of the adjacency's largest entry: float32 sums in another order, over 12 layers
END_OF_TEXT = 50256  # GPT-2's <|endoftext|>
GOAL = 1.0  # ours / circuit-tracer's time
PEER_BATCH = 128  # circuit-tracer's batch_size: targets per backward pass, and copies of the prompt in its forward
DIFFERENT = "NOT THE SAME GRAPH"
MARGIN = 1e-3  # between each JumpReLU threshold and the prompt's pre-activations: see thresholds_off_the_prompt
SELECTED_APART = 0.01  # of the selected features, at most this share chosen by one engine alone


def random_transcoders(n_layer, d_model, d_transcoder, seed=0):  # -> TranscoderSet, as the module docstring says
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(n_layer):
        layers.append({  # W_enc rows of norm about 1 on an input of norm sqrt(d_model): pre-activations about N(0, 1)
            "W_enc": rng.standard_normal((d_transcoder, d_model), dtype=np.float32) / np.float32(np.sqrt(d_model)),
            "b_enc": rng.standard_normal(d_transcoder, dtype=np.float32) * np.float32(0.1),
            "W_dec": rng.standard_normal((d_transcoder, d_model), dtype=np.float32) * np.float32(0.1 / d_model**0.5),
            "b_dec": rng.standard_normal(d_model, dtype=np.float32) * np.float32(0.1),
            "threshold": rng.uniform(*THRESHOLDS, d_transcoder).astype(np.float32)})
    return TranscoderSet(layers, "ln2.hook_normalized", "hook_mlp_out", "gpt2-numpy-benchmark")


def prompt(n_tokens):  # -> int [n_tokens]: <|endoftext|>, then fixed pseudo-random ids
    rest = np.random.default_rng(2).integers(0, END_OF_TEXT, n_tokens - 1)
    return np.concatenate([[END_OF_TEXT], rest]).astype(np.int64)


class Peer:  # circuit-tracer in its own process, one attribute() per run()
    def __init__(self, python, folder, max_features):
        self.folder = folder
        self.process = subprocess.Popen([str(python), "-m", "scripts.bench.circuit_tracer_peer", str(folder),
                                         str(blas_threads()), str(max_features), str(PEER_BATCH), str(QUEUE)],
                                        cwd=REPO, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
        self.answer("ready")

    def answer(self, word):  # -> the rest of the peer's next line that starts with word (other lines are its logs)
        for line in self.process.stdout:
            if line.startswith(word):
                return line[len(word):].strip()
        raise RuntimeError(f"circuit-tracer's process ended (status {self.process.wait()}) before saying {word!r}")

    def run(self):  # -> seconds of one attribute()
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return said(CIRCUIT_TRACER, float(self.answer("seconds")))

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def said(name, seconds):  # -> seconds, on stderr too: a turn takes minutes, and a later one may fail
    print(f"{name}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


def graph_metric(shape):  # -> the row's name
    return (f"attribution graph, {shape.n_layer} layers x {shape.n_embd}, transcoders of {shape.d_transcoder:,}, "
            f"{shape.n_tokens} tokens, {shape.max_features:,} features (s)")


SHAPE_124M_METRIC = graph_metric(SHAPE_124M)


def graph_rows(repeats, shape=SHAPE_124M, python=PEER_PYTHON, theirs=CIRCUIT_TRACER):  # -> [row], the check's line
    # (None without circuit-tracer)
    hparams = {**HPARAMS_124M, "n_layer": shape.n_layer, "n_embd": shape.n_embd, "n_head": shape.n_head}
    params = random_params(hparams)
    transcoders = random_transcoders(shape.n_layer, shape.n_embd, shape.d_transcoder)
    ids = prompt(shape.n_tokens)
    thresholds_off_the_prompt(transcoders, params, shape.n_head, ids)
    graphs = []

    def ours():
        start = time.perf_counter()
        graphs[:] = [attribution_graph(ids, params, shape.n_head, transcoders, max_features=shape.max_features)]
        return said(OURS, time.perf_counter() - start)

    metric = graph_metric(shape)
    if not Path(python).exists():
        seconds = in_turns({OURS: ours}, repeats, warm_up=False)
        return [row(f"{metric} (circuit-tracer's venv {python} is missing: {INSTALL})", "lower", seconds)], None
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        save_model(folder / "model", hparams, params, PACKAGED_VOCABULARY)
        save_transcoders(transcoders, folder / "transcoders")
        np.save(folder / "ids.npy", ids)
        peer = Peer(python, folder, shape.max_features)
        try:
            seconds = in_turns({OURS: ours, theirs: peer.run}, repeats, warm_up=False)
        finally:
            peer.close()
        check = agreement(graphs[0], np.load(folder / "theirs.npz"))
    if theirs != CIRCUIT_TRACER:
        metric += f" ({theirs}'s column: circuit-tracer's attribute())"
    if check.endswith(DIFFERENT):  # the times are of different work: the row says so wherever it is shown
        metric += f" ({DIFFERENT}: python -m scripts.bench.circuits says how)"
    return [row(metric, "lower", seconds)], check


def agreement(graph, theirs):  # -> a line: whether our graph is circuit-tracer's
    ours, its = [feature_names(active, selected) for active, selected in (
        (graph.active_features, graph.selected_features), (theirs["active_features"], theirs["selected_features"]))]
    both = set(ours) & set(its)
    one_only = len(set(feature_names(graph.active_features)) ^ set(feature_names(theirs["active_features"])))
    line = (f"{len(graph.active_features):,} active features ({one_only} in one engine's only); selected: "
            f"{len(both):,} of {len(ours):,} in both")
    if not np.array_equal(graph.logit_token_ids, theirs["logit_token_ids"]):
        return line + f"; other logits: {DIFFERENT}"
    # the nodes both have, in both engines' order: the features selected by both, then every error, token and logit
    rest = len(graph.adjacency) - len(ours)
    keep = [np.concatenate([[i for i, name in enumerate(names) if name in both], len(names) + np.arange(rest)])
            .astype(int) for names in (ours, its)]
    mine, their = graph.adjacency[np.ix_(keep[0], keep[0])], theirs["adjacency"][np.ix_(keep[1], keep[1])]
    difference = np.abs(mine - their).max() / np.abs(their).max()
    differ = len(ours) - len(both)
    if difference > CHECK_RTOL or differ > len(ours) * SELECTED_APART:
        verdict = DIFFERENT
    else:  # a few near-ties in the ranking may go either way: the same work all the same
        verdict = "the same graph" + (f", but for {differ} near-tied features" if differ else "")
    return line + f"; adjacency over the {len(mine):,} nodes both have: largest difference {difference:.1e} of its " \
        f"largest entry: {verdict}"


def feature_names(active, selected=slice(None)):  # -> [(layer, position, feature)] of the selected, in their order
    return list(map(tuple, active[selected].tolist()))


def thresholds_off_the_prompt(transcoders, params, n_head, ids):  # -> None: thresholds moved by MARGIN where needed
    # a pre-activation within float32's rounding of its JumpReLU threshold may fire in one engine and not the other:
    # the benchmark's thresholds keep MARGIN clear of the prompt's pre-activations, so both find the same features
    arrays = trace(ids, params, n_head)
    for layer, params_of_layer in enumerate(transcoders.layers):
        pre = pre_activations(params_of_layer, layer_input(transcoders, layer, arrays))
        while (near := (np.abs(pre - params_of_layer["threshold"]) < MARGIN).any(axis=0)).any():
            params_of_layer["threshold"][near] += np.float32(2 * MARGIN)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--layers", type=int, default=SHAPE_124M.n_layer)
    parser.add_argument("--width", type=int, default=SHAPE_124M.n_embd, help="n_embd (64 per head)")
    parser.add_argument("--features", type=int, default=SHAPE_124M.d_transcoder, help="per transcoder")
    parser.add_argument("--tokens", type=int, default=SHAPE_124M.n_tokens, help="the prompt's, <|endoftext|> first")
    parser.add_argument("--max-features", type=int, default=SHAPE_124M.max_features)
    parser.add_argument("--circuit-tracer-python", type=Path, default=PEER_PYTHON, metavar="PYTHON",
                        help="the python of a venv with circuit-tracer (default: %(default)s)")
    args = parser.parse_args(argv)
    keep_freed_memory()
    shape = Shape(args.layers, args.width, args.width // 64, args.features, args.tokens, args.max_features)
    rows, check = graph_rows(args.repeats, shape, args.circuit_tracer_python)
    names = [OURS, CIRCUIT_TRACER] if CIRCUIT_TRACER in rows[0] else [OURS]
    print(f"BLAS threads {blas_threads()}, numpy {np.__version__}\n")
    print("\n".join(comparison_table(rows, names)))
    if check:
        ratio = rows[0][OURS] / rows[0][CIRCUIT_TRACER]
        print(f"\ncheck: {check}\ngoal: at most {GOAL:g}x circuit-tracer's time: {ratio:.2f}x, "
              f"{'met' if ratio <= GOAL else 'MISSED'}")


if __name__ == "__main__":
    main(sys.argv[1:])
