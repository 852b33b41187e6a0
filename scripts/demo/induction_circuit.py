"""The induction circuit as an attribution graph: transcoders for both MLPs of the induction demo's model
(scripts/demo/induction.sh), the graph of a repeated random sequence at a position of its second copy, and the graph
held against interventions on the model itself.

    python -m scripts.demo.induction_circuit MODEL OUT [--steps N] [--d-sae N] [--k K] [--transcoders DIR]
        [--screenshot PNG]

MODEL: the folder induction.sh wrote (its texts/train.txt is what the transcoders train on); OUT: a new folder.
1. `gpt2-numpy sae train --transcoder` a transcoder with a skip for each MLP (reading ln_2, writing mlp.out) into
   OUT/transcoders (or takes --transcoders DIR's set); `gpt2-numpy sae eval --transcoders` on a text of the same
   kind it never saw (OUT/held-out.txt).
2. The prompt: random lowercase letters said once, then the first few again (seeded), so that the last letter A
   stood before, followed by B: an induction circuit predicts B. `gpt2-numpy circuits graph` draws its graph into
   OUT/graph (graph.npz, circuit-tracer's JSON, graph.html with the top contexts from the held-out text).
3. From the unpruned adjacency, each node's total effect on B's logit through every path of the linearized model
   (a feature's share of a target is its edge over the target's activation, so a path multiplies edge/activation
   along it): the input positions ranked by their tokens' total effect, which should put B's first occurrence first,
   and the layer-1 head whose frozen pattern carries it (its weight from the last position to that one).
4. The 3 features with the largest total effect on B's logit, each switched off in the model (every MLP replaced by
   its transcoder plus its error, sae/replacement.py, through run_with_edits): the change of B's logit less the
   mean logit (what the graph's logit node measures), against the graph's prediction, minus the feature's total
   effect. Twice: in the graph's own local replacement model, every attention pattern, LayerNorm denominator and
   MLP error held at the prompt's values by edits (graph_model_edits), where the check is the same sign and the
   measured change within TOLERANCE of the predicted one (what is left: downstream features switching on or off);
   and as the model runs, where a feature at B's first position also changes the keys the induction head matches
   (its QK circuit) and the norms, which a graph of frozen patterns and norms leaves out by construction.
Prints the numbers and writes them to OUT/numbers.json; --screenshot PNG draws the page with B's logit clicked (with
selenium and Debian's chromium chromium-driver, as scripts/demo/screenshot_graph.py).
"""
import argparse
import functools
import json
import string
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpt2_numpy import load_model
from gpt2_numpy.sae.transcoder_files import load_transcoders
from gpt2_numpy.sae.replacement import record, replacement_edits
from gpt2_numpy.sae.transcoder_model import input_name, transcode, transcoder_input
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.tracing import attention_weights, trace

TOLERANCE = 0.25  # the measured change within this share of the predicted one (fixed before the first run)
PROMPT_SEED, FIRST_COPY, SECOND_COPY = 0, 10, 6  # letters said once, then this many of them again
TOP_FEATURES = 3


def run(*args):  # -> None: a command of this package, its output shown; its failure ends the demo
    command = [sys.executable, "-m", "gpt2_numpy", *map(str, args)]
    print("$", " ".join(command[2:]), flush=True)
    if subprocess.run(command).returncode:
        sys.exit(f"error: {' '.join(command[2:])} failed")


def induction_prompt(seed=PROMPT_SEED):  # -> (the prompt, B: the letter that followed the last letter before)
    letters = np.random.default_rng(seed).choice(list(string.ascii_lowercase), FIRST_COPY, replace=False)
    return "".join(letters) + "".join(letters[:SECOND_COPY]), str(letters[SECOND_COPY])


def total_effects(adjacency, activations, target):  # [n, n], [n], int -> [n]: each node's total effect on target
    """c_s = A[target, s] + sum over feature targets t of A[t, s] / act_t * c_t (a feature's part of t is its edge over
    t's activation): c = e_targetᵀ (I - Â)⁻¹, Â the adjacency with each feature row divided by its activation, the
    target's row as it is and every other row 0 (errors, tokens and logits have no inputs)."""
    n = len(adjacency)
    rows = np.zeros((n, n))
    is_feature = np.isfinite(activations)
    rows[is_feature] = adjacency[is_feature] / activations[is_feature, None]
    rows[target] = adjacency[target]
    return np.linalg.solve(np.eye(n) - rows.T, np.eye(n)[target])


def graph_model_edits(clean, transcoders, n_layer):  # -> [Edit]: the graph's local replacement model, for the
    # transcoder edits after them: the attention patterns, the LayerNorms' denominators and each MLP's error (its output
    # less its transcoder's) held at the values of the clean run's arrays `clean` (trace's names)
    edits = [Edit(f"blocks.{layer}.attn.weights", lambda array, kept=clean[f"blocks.{layer}.attn.weights"]: kept)
             for layer in range(n_layer)]
    norms = {f"blocks.{layer}.ln_1": "embed" if layer == 0 else f"blocks.{layer - 1}.out" for layer in range(n_layer)}
    norms.update({f"blocks.{layer}.ln_2": f"blocks.{layer}.mid" for layer in range(n_layer)})
    norms["ln_f"] = f"blocks.{n_layer - 1}.out"
    for norm, reads in norms.items():
        seen = {}
        scale = np.sqrt(np.var(clean[reads], axis=-1, keepdims=True) + 1e-5)  # layer_norm's denominator, eps 1e-5
        edits += [Edit(reads, functools.partial(record, seen)),
                  Edit(f"{norm}.normalized", lambda array, seen=seen, scale=scale:
                       (seen["input"] - seen["input"].mean(-1, keepdims=True)) / scale)]
    errors = [clean[f"blocks.{layer}.mlp.out"] - transcoded(transcoders, layer, clean) for layer in range(n_layer)]
    return edits, [Edit(f"blocks.{layer}.mlp.out", lambda array, error=error: array + error)
                   for layer, error in enumerate(errors)]


def transcoded(transcoders, layer, arrays):  # -> [n_seq, d_model]: layer's transcoder output on a run's arrays
    x = transcoder_input(transcoders.input_hook, arrays[input_name(transcoders.input_hook, layer)])
    return transcode(transcoders.layers[layer], x)


def logit_less_mean(ids, params, n_head, edits, token):  # -> B's logit less the mean logit at the last position
    logits = run_with_edits(ids, params, n_head, edits, names=["logits"])["logits"][-1].astype(np.float64)
    return logits[token] - logits.mean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="the folder scripts/demo/induction.sh wrote")
    parser.add_argument("out", type=Path, help="a new folder for the transcoders, the graph and numbers.json")
    parser.add_argument("--steps", type=int, default=3000, help="transcoder training steps of 1,024 positions (3000)")
    parser.add_argument("--d-sae", type=int, default=512, help="features of each transcoder (512)")
    parser.add_argument("--k", type=int, default=16, help="features active per position (16)")
    parser.add_argument("--transcoders", type=Path, help="use this transcoder set instead of training one")
    parser.add_argument("--screenshot", type=Path, help="also draw the graph's page into this PNG")
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"error: {args.out} exists: pass a folder that does not exist yet")
    args.out.mkdir(parents=True)
    transcoders_dir, graph_dir, held_out = args.out / "transcoders", args.out / "graph", args.out / "held-out.txt"

    subprocess.run([sys.executable, "-m", "scripts.demo.induction_text", str(held_out), "--seed", "2", "--copies",
                    "3", "--chars", "20000"], check=True)
    if args.transcoders:
        transcoders_dir = args.transcoders
    else:
        run("sae", "train", "--transcoder", "--model", args.model, "--hook", "ln_2", "--target", "mlp.out", "--skip",
            "--data", args.model / "texts" / "train.txt", "--out", transcoders_dir, "--d-sae", args.d_sae, "--k",
            args.k, "--steps", args.steps, "--batch-size", 1024, "--seq-len", 32, "--lr", 1e-3)
    run("sae", "eval", "--transcoders", transcoders_dir, "--model", args.model, "--data", held_out, "--seq-len", 32,
        "--windows", 64)
    prompt, answer = induction_prompt()
    run("circuits", "graph", "--model", args.model, "--transcoders", transcoders_dir, prompt, "--out", graph_dir,
        "--contexts-from", held_out)

    hparams, params, tokenizer = load_model(args.model)
    n_head, transcoders = hparams["n_head"], load_transcoders(transcoders_dir)
    graph = np.load(graph_dir / "graph.npz")
    ids = graph["input_ids"].tolist()
    answer_id = tokenizer.encode(answer)[0]
    logit_ids = graph["logit_token_ids"].tolist()
    if answer_id not in logit_ids:
        sys.exit(f"error: {answer!r} is not among the graph's logits {logit_ids}: the model predicts no induction here")
    selected = graph["selected_features"]
    n_features, n_seq, n_layer = len(selected), len(ids), hparams["n_layer"]
    tokens_start = n_features + n_layer * n_seq
    target = tokens_start + n_seq + logit_ids.index(answer_id)
    activations = np.full(len(graph["adjacency"]), np.nan)
    activations[:n_features] = graph["activation_values"][selected]
    effects = total_effects(graph["adjacency"].astype(np.float64), activations, target)

    # 3. the input positions by their token's total effect on B's logit
    token_effects = effects[tokens_start:tokens_start + n_seq]
    first_b = ids.index(answer_id)  # B's first occurrence: the token after A's
    by_position = np.argsort(-np.abs(token_effects))
    weights = attention_weights(np.array(ids), params, n_head)  # [layer, head, query, key]
    head = int(np.argmax(weights[-1][:, -1, first_b]))

    # 4. the strongest features, switched off in the model
    feature_order = np.argsort(-np.abs(effects[:n_features]))[:TOP_FEATURES]
    frozen, errors = graph_model_edits(trace(np.array(ids), params, n_head), transcoders, n_layer)
    before = logit_less_mean(ids, params, n_head, replacement_edits(transcoders, keep_error=True), answer_id)
    in_graph_before = logit_less_mean(ids, params, n_head, frozen + replacement_edits(transcoders) + errors, answer_id)
    interventions = []
    for node in feature_order:
        layer, position, feature = map(int, graph["active_features"][selected[node]])
        off = [(layer, position, feature)]
        in_graph = frozen + replacement_edits(transcoders, zeroed=off) + errors
        measured = logit_less_mean(ids, params, n_head, in_graph, answer_id) - in_graph_before
        free = logit_less_mean(ids, params, n_head, replacement_edits(transcoders, keep_error=True, zeroed=off),
                               answer_id) - before
        predicted = -effects[node]
        interventions.append({"layer": layer, "position": position, "feature": feature,
                              "activation": float(activations[node]), "predicted": float(predicted),
                              "measured_frozen": float(measured), "measured": float(free),
                              "agrees": bool(np.sign(measured) == np.sign(predicted) and
                                             abs(measured - predicted) <= TOLERANCE * abs(predicted))})

    numbers = {"prompt": prompt, "answer": answer, "input_ids": ids,
               "answer_probability": float(graph["logit_probabilities"][logit_ids.index(answer_id)]),
               "answer_is_top": logit_ids[0] == answer_id, "first_answer_position": first_b,
               "token_effects": [float(effect) for effect in token_effects],
               "strongest_position": int(by_position[0]),
               "carrying_head": [n_layer - 1, head], "carrying_weight": float(weights[-1][head, -1, first_b]),
               "interventions": interventions, "tolerance": TOLERANCE}
    (args.out / "numbers.json").write_text(json.dumps(numbers, indent=1) + "\n")
    text = [tokenizer.decode([token]) if token != tokenizer.eot_id else "<|endoftext|>" for token in ids]
    print(f"\nprompt {prompt!r} after <|endoftext|>: the last letter {prompt[-1]!r} stood at position "
          f"{first_b - 1}, followed by {answer!r}; the graph's logits: "
          + ", ".join(f"{tokenizer.decode([t])!r} {p:.3f}" for t, p in zip(logit_ids, graph["logit_probabilities"])))
    print(f"total effect on {answer!r}'s logit of each input token, the strongest first:")
    for position in by_position[:4]:
        print(f"  position {position:2d} {text[position]!r}: {token_effects[position]:+.3f}")
    print(f"the strongest is position {by_position[0]} ({'B' if by_position[0] == first_b else 'not B'}'s first "
          f"occurrence is {first_b}); head {n_layer - 1}.{head}'s frozen pattern puts "
          f"{weights[-1][head, -1, first_b]:.3f} of the last position's weight there")
    print(f"switching off the {TOP_FEATURES} features with the largest total effect ({answer!r}'s logit less the mean, "
          f"{before:.3f} before):")
    for each in interventions:
        print(f"  layer {each['layer']} position {each['position']} feature {each['feature']} (activation "
              f"{each['activation']:.3f}): predicted {each['predicted']:+.3f}; measured in the graph's model "
              f"{each['measured_frozen']:+.3f} ({'agrees' if each['agrees'] else 'DISAGREES'}: same sign, within "
              f"{TOLERANCE:.0%}), as the model runs {each['measured']:+.3f}")
    print(f"wrote {args.out / 'numbers.json'}, {graph_dir / 'graph.html'}")
    if args.screenshot:
        subprocess.run([sys.executable, "-m", "scripts.demo.screenshot_graph", str(graph_dir / "graph.html"),
                        str(args.screenshot), "--node", str(target)], check=True)


if __name__ == "__main__":
    main()
