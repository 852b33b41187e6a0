"""`gpt2-numpy circuits`: circuits between transcoder features (gpt2_numpy/circuits/ holds the math and the files).

    gpt2-numpy circuits graph --model my-gpt --transcoders my-transcoders "the cat sat on the" --out cat-graph

graph writes, into --out: graph.npz (circuit-tracer's Graph fields: adjacency [n, n], rows targets and columns
sources, active_features, selected_features, activation_values, logit_token_ids, logit_probabilities, input_ids;
and the pruning's node_mask, edge_mask, cumulative_scores), and graph.json with graph-metadata.json, the files
circuit-tracer's viewer opens. Everything is computed and checked before anything is written.
"""
import json
from pathlib import Path

import numpy as np

from gpt2_numpy.circuits.files import check_fits, load_transcoders
from gpt2_numpy.circuits.graph import attribution_graph
from gpt2_numpy.circuits.prune import prune
from gpt2_numpy.circuits.viewer import viewer_graph
from gpt2_numpy.commands.common import (
    ArgumentParser, add_model_args, fraction, model_from_args, path_argument, read_prompt, subcommand_cli,
    whole_number,
)
from gpt2_numpy.console import log, plural
from gpt2_numpy.disk import atomic_write
from gpt2_numpy.errors import UsageError
from gpt2_numpy.loading import prompt_ids
from gpt2_numpy.tokenizer import check_in_vocabulary

SUBCOMMANDS = {"graph": "the attribution graph of a prompt through transcoders, as circuit-tracer computes it"}
SLUG = "graph"  # the viewer's name of the graph: graph.json
WRITTEN = ("graph.npz", f"{SLUG}.json", "graph-metadata.json")  # what graph writes into --out


def graph_parser():  # -> the parser of `circuits graph`
    parser = ArgumentParser(prog="gpt2-numpy circuits graph", description="The attribution graph of a prompt: every "
                            "active transcoder feature, error and token, the top logits, and the direct effect of each "
                            "on the others through the model with attention patterns and LayerNorm scales frozen.")
    parser.add_argument("prompt", help="the prompt ('-' reads stdin)")
    add_model_args(parser)
    parser.add_argument("--transcoders", required=True, type=path_argument, metavar="DIR",
                        help="a transcoder-set folder (circuit-tracer's: config.yaml + layer_<i>.safetensors)")
    parser.add_argument("--out", required=True, type=path_argument, metavar="DIR",
                        help="the folder to write graph.npz, graph.json and graph-metadata.json into")
    parser.add_argument("--no-bos", action="store_true", help="do not put <|endoftext|> first (circuit-tracer does)")
    parser.add_argument("--max-logits", type=whole_number(1), default=10, metavar="K",
                        help="at most K logit nodes (10)")
    parser.add_argument("--logit-prob", type=fraction, default=0.95, metavar="P",
                        help="logit nodes until P of the probability is covered (0.95)")
    parser.add_argument("--max-features", type=whole_number(1), metavar="N",
                        help="at most N feature nodes, the most influential (default: every active one)")
    parser.add_argument("--node-threshold", type=fraction, default=0.8, metavar="P",
                        help="pruning: keep the nodes that carry P of the influence on the logits (0.8)")
    parser.add_argument("--edge-threshold", type=fraction, default=0.98, metavar="P",
                        help="pruning: keep the edges that carry P of the influence (0.98)")
    return parser


def check_out(out):  # -> None; UsageError when --out is a file, or a folder holding files graph does not write
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give a new folder, or one that holds an earlier graph")
    others = sorted(path.name for path in out.iterdir() if path.name not in WRITTEN) if out.is_dir() else []
    if others:
        raise UsageError(f"--out {out} holds other files ({', '.join(others[:3])}): give a new folder, or one that "
                         "holds an earlier graph")


def graph_ids(args, hparams, tokenizer, text):  # -> int [n_seq]: the prompt's ids, <|endoftext|> first unless --no-bos
    words = prompt_ids(tokenizer, text, hparams["n_vocab"]) if text or args.no_bos else []  # "" alone: [eot]
    bos = [] if args.no_bos else check_in_vocabulary(tokenizer, [tokenizer.eot_id], hparams["n_vocab"], "the BOS",
                                                     "pass --no-bos for a model without <|endoftext|>")
    ids = bos + words
    if len(ids) > hparams["n_ctx"]:
        raise UsageError(f"the prompt's {plural(len(ids), 'token')} exceed the model's context of {hparams['n_ctx']} "
                         "tokens: shorten it")
    return np.array(ids)


def graph(argv):  # -> exit status
    args = graph_parser().parse_args(argv)
    text = read_prompt(args.prompt)
    check_out(args.out)
    transcoders = load_transcoders(args.transcoders)  # a damaged set costs no model load
    hparams, params, tokenizer = model_from_args(args)
    check_fits(transcoders, hparams["n_layer"], hparams["n_embd"])
    ids = graph_ids(args, hparams, tokenizer, text)
    found = attribution_graph(ids, params, hparams["n_head"], transcoders, args.max_logits, args.logit_prob,
                              args.max_features)
    pruned = prune(found, args.node_threshold, args.edge_threshold)
    viewer = viewer_graph(found, pruned, tokenizer.decode, SLUG, transcoders.scan or "gpt2-numpy",
                          args.node_threshold)
    fields = {**found._asdict(), **pruned._asdict()}
    del fields["n_layer"]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "graph.npz", lambda file: np.savez(file, **fields))
    atomic_write(args.out / f"{SLUG}.json", lambda file: file.write(json.dumps(viewer, indent=2).encode()))
    atomic_write(args.out / "graph-metadata.json",
                 lambda file: file.write(json.dumps({"graphs": [viewer["metadata"]]}, indent=2).encode()))
    log(f"{plural(len(found.active_features), 'active feature')}, {plural(len(found.logit_token_ids), 'logit')}, "
        f"{plural(len(found.adjacency), 'node')}; pruned to {plural(int(pruned.node_mask.sum()), 'node')} and "
        f"{plural(int(pruned.edge_mask.sum()), 'edge')}; wrote {Path(args.out)}/")
    return 0


HANDLERS = {"graph": graph}
run, main = subcommand_cli("circuits", SUBCOMMANDS, HANDLERS)  # run(argv) -> exit status; main(argv) exits


if __name__ == "__main__":
    main()
