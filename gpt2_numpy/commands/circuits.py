"""`gpt2-numpy circuits`: circuits between transcoder features (gpt2_numpy/circuits/ holds the math and the files).

    gpt2-numpy circuits graph --model my-gpt --transcoders my-transcoders "the cat sat on the" --out cat-graph

graph writes, into --out: graph.npz (circuit-tracer's Graph fields: adjacency [n, n], rows targets and columns
sources, active_features, selected_features, activation_values, logit_token_ids, logit_probabilities, input_ids;
and the pruning's node_mask, edge_mask, cumulative_scores), graph.json with graph-metadata.json, the files
circuit-tracer's viewer opens, and graph.html, our offline page of the pruned graph (circuits/page.py), with each
feature's strongest contexts in the text of --contexts-from. Everything is computed and checked before anything is
written.
"""
import json
from pathlib import Path

import numpy as np

from gpt2_numpy.sae.transcoder_files import check_fits, load_transcoders
from gpt2_numpy.circuits.graph import attribution_graph
from gpt2_numpy.circuits.page import contexts, graph_data, graph_features, graph_html
from gpt2_numpy.circuits.prune import prune
from gpt2_numpy.circuits.viewer import viewer_graph
from gpt2_numpy.commands.common import (
    ArgumentParser, add_model_args, fraction, model_from_args, path_argument, read_data, read_prompt, subcommand_cli,
    whole_number,
)
from gpt2_numpy.console import log, plural
from gpt2_numpy.disk import atomic_write
from gpt2_numpy.errors import UsageError
from gpt2_numpy.loading import prompt_ids
from gpt2_numpy.tokenizer import check_in_vocabulary, token_windows

SUBCOMMANDS = {"graph": "the attribution graph of a prompt through transcoders, as circuit-tracer computes it"}
SLUG = "graph"  # the viewer's name of the graph: graph.json
WRITTEN = ("graph.npz", f"{SLUG}.json", "graph-metadata.json", "graph.html")  # what graph writes into --out
CONTEXT_WINDOW = 128  # tokens per window of --contexts-from, at most (and at most the model's context)
CONTEXT_WINDOWS = 64  # windows of --contexts-from read without --windows
NO_CONTEXTS = ("No contexts: run circuits graph again with --contexts-from FILE (a UTF-8 text; --windows N of its "
               "windows are read) to see each feature's top-activating contexts here.")


def graph_parser():  # -> the parser of `circuits graph`
    parser = ArgumentParser(prog="gpt2-numpy circuits graph", description="The attribution graph of a prompt: every "
                            "active transcoder feature, error and token, the top logits, and the direct effect of each "
                            "on the others through the model with attention patterns and LayerNorm scales frozen.")
    parser.add_argument("prompt", help="the prompt ('-' reads stdin)")
    add_model_args(parser)
    parser.add_argument("--transcoders", required=True, type=path_argument, metavar="DIR",
                        help="a transcoder-set folder (circuit-tracer's: config.yaml + layer_<i>.safetensors)")
    parser.add_argument("--out", required=True, type=path_argument, metavar="DIR",
                        help="the folder to write graph.npz, graph.json, graph-metadata.json and graph.html into")
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
    parser.add_argument("--contexts-from", type=path_argument, metavar="FILE",
                        help="a UTF-8 text: graph.html shows each kept feature's strongest contexts in it")
    parser.add_argument("--windows", type=whole_number(1), metavar="N",
                        help=f"with --contexts-from: read its first N windows of up to {CONTEXT_WINDOW} tokens "
                        f"({CONTEXT_WINDOWS})")
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
    if args.windows is not None and args.contexts_from is None:
        raise UsageError("--windows belongs to --contexts-from: add --contexts-from FILE, or drop --windows")
    text = read_prompt(args.prompt)
    check_out(args.out)
    context_text = None if args.contexts_from is None else read_data(args.contexts_from, "--contexts-from")
    transcoders = load_transcoders(args.transcoders)  # a damaged set costs no model load
    hparams, params, tokenizer = model_from_args(args)
    check_fits(transcoders, hparams["n_layer"], hparams["n_embd"])
    ids = graph_ids(args, hparams, tokenizer, text)
    windows = None if context_text is None else context_windows(args, hparams, tokenizer, context_text)
    found = attribution_graph(ids, params, hparams["n_head"], transcoders, args.max_logits, args.logit_prob,
                              args.max_features)
    pruned = prune(found, args.node_threshold, args.edge_threshold)
    viewer = viewer_graph(found, pruned, tokenizer.decode, SLUG, transcoders.scan or "gpt2-numpy",
                          args.node_threshold)
    page = graph_html(page_data(args, hparams, params, tokenizer, transcoders, found, pruned, windows))
    fields = {**found._asdict(), **pruned._asdict()}
    del fields["n_layer"]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "graph.npz", lambda file: np.savez(file, **fields))
    atomic_write(args.out / f"{SLUG}.json", lambda file: file.write(json.dumps(viewer, indent=2).encode()))
    atomic_write(args.out / "graph-metadata.json",
                 lambda file: file.write(json.dumps({"graphs": [viewer["metadata"]]}, indent=2).encode()))
    atomic_write(args.out / "graph.html", lambda file: file.write(page.encode("utf-8")))
    log(f"{plural(len(found.active_features), 'active feature')}, {plural(len(found.logit_token_ids), 'logit')}, "
        f"{plural(len(found.adjacency), 'node')}; pruned to {plural(int(pruned.node_mask.sum()), 'node')} and "
        f"{plural(int(pruned.edge_mask.sum()), 'edge')}; wrote {Path(args.out)}/")
    return 0


def context_windows(args, hparams, tokenizer, text):  # -> int [n_windows, n_seq]: --contexts-from's first windows
    if not text:
        raise UsageError(f"--contexts-from {args.contexts_from} is empty: give a text to find the contexts in")
    ids = prompt_ids(tokenizer, text, hparams["n_vocab"], f"--contexts-from {args.contexts_from}")
    # a text shorter than a window is one window
    return token_windows(ids, min(CONTEXT_WINDOW, hparams["n_ctx"], len(ids)), args.windows or CONTEXT_WINDOWS)


def page_data(args, hparams, params, tokenizer, transcoders, found, pruned, windows):  # -> graph.html's data
    title = f"Attribution graph of {plural(len(found.input_ids), 'token')}"
    prompt = tokenizer.decode(found.input_ids.tolist())
    if windows is None:
        return graph_data(found, pruned, tokenizer.token_text, title, prompt, None, NO_CONTEXTS)
    found_contexts = contexts(windows, params, hparams["n_head"], transcoders, graph_features(found, pruned),
                              tokenizer.token_text)
    note = (f"Contexts from {args.contexts_from.name}: {plural(len(windows), 'window')} of "
            f"{plural(windows.shape[1], 'token')}.")
    return graph_data(found, pruned, tokenizer.token_text, title, prompt, found_contexts, note)


HANDLERS = {"graph": graph}
run, main = subcommand_cli("circuits", SUBCOMMANDS, HANDLERS)  # run(argv) -> exit status; main(argv) exits


if __name__ == "__main__":
    main()
