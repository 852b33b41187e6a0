"""See attention at work: the attention blog posts' walkthrough, on GPT-2's own weights and the reader's own sentence.

    python -m gpt2_numpy.explain "The cat sat on the mat" --layer 5 --head 1
    python -m gpt2_numpy.explain "The cat sat on the mat" --layer 5 --head all --plot heads.png

stdout gets the prompt's tokens, the shape of every step of one forward pass, one head's attention step by step
(q·kᵀ, the scaling, the causal mask, the softmax, the output) and the next-token prediction; --plot draws the attention
weights as a heatmap (matplotlib, the optional extra `pip install -e ".[plot]"`).

Every array comes from model.py's own functions, composed here in the order `block` runs them (the attention weights
as the blogs write them: `attention` itself divides by their row sums after the product with v, the same numbers): no
formula of the model is written twice, and the model itself carries the residual stream from block to block. From
Python: `attention_weights(inputs, params, n_head)` gives every head's weights, `walkthrough` every step's array.
"""
import functools
import math
import os
import sys
from pathlib import Path

import numpy as np

from gpt2_numpy.cli import add_model_args, load_model, prompt_ids, read_prompt, write_stdout
from gpt2_numpy.errors import ArgumentParser, UsageError, log, plural, run_cli
from gpt2_numpy.fast import (
    attention,
    attention_scores,
    block,
    causal_mask,
    embed,
    gelu,
    layer_norm,
    linear,
    lm_head,
    merge_heads,
    softmax,
    split_heads,
)

SHOWN = 8  # rows, columns and dimensions of one head's matrices printed: a longer prompt shows its top-left corner
TOP_K = 5  # next tokens listed in the prediction
LABEL_WIDTH = 15  # characters of a token's label: '<|endoftext|>' with its quotes
PLOT_SUFFIXES = (".png", ".svg")
PLOT_INSTALL = 'pip install -e ".[plot]"'
MAX_TICKS = 40  # tick labels per heatmap axis: a longer prompt labels every k-th token


# --- The arrays: model.py's functions, composed in the model's order ---


def attention_weights(inputs, params, n_head):  # [n_seq] -> float32 [n_layer, n_head, n_seq, n_seq]
    """The softmax attention weights of every head of every layer on the token ids `inputs`, as the model computes
    them: [layer, head, i, j] is how much position i attends to position j (0 for j > i; each row sums to 1)."""
    x = embed(inputs, params["wte"], params["wpe"])
    mask = causal_mask(x.shape[-2], x.shape[-2])
    stream = residual_stream(x, params["blocks"], n_head, mask)
    # blocks first in zip: the stream is lazy, so the last block, whose output no weight needs, never runs
    return np.stack([attention_steps(layer_input, block_params["ln_1"], block_params["attn"], n_head, mask)["weights"]
                     for block_params, layer_input in zip(params["blocks"], stream)])


def walkthrough(inputs, params, n_head, layer):  # [n_seq] -> {step name: array}
    """One forward pass of gpt2() with the arrays a reader follows, in the order the code runs them: "wte" and "wpe"
    (the rows embed adds), "embed", "mask", every step of block `layer` (see block_steps), "ln_f" and "logits",
    which are gpt2()'s. UsageError when there is no such layer."""
    check_index(layer, len(params["blocks"]), "layer", "layer")
    wte, wpe = params["wte"], params["wpe"]
    x = embed(inputs, wte, wpe)  # first: it checks the ids
    n_seq = x.shape[-2]
    steps = {"wte": wte[np.asarray(inputs)], "wpe": wpe[:n_seq], "embed": x, "mask": causal_mask(n_seq, n_seq)}
    stream = list(residual_stream(x, params["blocks"], n_head, steps["mask"]))  # n_layer + 1 arrays [n_seq, n_embd]
    steps.update(block_steps(stream[layer], **params["blocks"][layer], n_head=n_head, mask=steps["mask"]))
    steps["ln_f"] = layer_norm(stream[-1], **params["ln_f"])
    steps["logits"] = lm_head(steps["ln_f"], wte)
    return steps


def residual_stream(x, blocks, n_head, mask):  # [n_seq, n_embd] -> iterator of n_layer + 1 arrays [n_seq, n_embd]
    # each block's input, then the last block's output: the model's own block carries x, not the steps composed here
    yield x
    for block_params in blocks:
        x = block(x, **block_params, n_head=n_head, mask=mask)
        yield x


def attention_steps(x, ln_1, attn, n_head, mask):  # [n_seq, n_embd] -> {step name: array}, as block and mha run them
    """The attention half of a block on its input x: "ln_1", "c_attn" ([n_seq, 3 n_embd]), "qkv" (split_heads:
    [3, n_head, n_seq, d_head]), "qk" (q·kᵀ unscaled), "scores" (attention_scores), "masked" (scores + mask),
    "weights" (their softmax), "heads" (attention's output, [n_head, n_seq, d_head]), "merge_heads" and "attn"
    (the c_proj output that mha returns)."""
    steps = {"ln_1": layer_norm(x, **ln_1)}
    steps["c_attn"] = linear(steps["ln_1"], **attn["c_attn"])
    steps["qkv"] = q, k, v = split_heads(steps["c_attn"], n_head)
    steps["qk"] = q @ k.swapaxes(-1, -2)  # the blogs' unscaled product, shown only: the model scales q first
    steps["scores"] = attention_scores(q, k)
    steps["masked"] = steps["scores"] + mask  # what attention adds before its softmax
    steps["weights"] = softmax(steps["masked"])  # the blogs' order: attention itself divides by the sums after @ v
    steps["heads"] = attention(q, k, v, mask)  # the model's own weighted sum of v: the same numbers as weights @ v
    steps["merge_heads"] = merge_heads(steps["heads"])
    steps["attn"] = linear(steps["merge_heads"], **attn["c_proj"])
    return steps


def block_steps(x, ln_1, attn, ln_2, mlp, n_head, mask):  # [n_seq, n_embd] -> {step name: array}, as block runs them
    """Every intermediate array of model.block on x: "x", attention_steps, then "attn_residual" (x + the attention
    output), "ln_2", "c_fc" (4 n_embd wide), "gelu", "mlp" (the c_proj output that ffn returns) and "out", which
    equals block(x, ...)."""
    steps = {"x": x, **attention_steps(x, ln_1, attn, n_head, mask)}
    steps["attn_residual"] = x + steps["attn"]
    steps["ln_2"] = layer_norm(steps["attn_residual"], **ln_2)
    steps["c_fc"] = linear(steps["ln_2"], **mlp["c_fc"])
    steps["gelu"] = gelu(steps["c_fc"])
    steps["mlp"] = linear(steps["gelu"], **mlp["c_proj"])
    steps["out"] = steps["attn_residual"] + steps["mlp"]
    return steps


# --- The printed walkthrough ---


def report(prompt, ids, label, steps, hparams, layer, head):  # -> the walkthrough's text, every section
    """The four sections `python -m gpt2_numpy.explain` prints, from walkthrough()'s steps for `layer` on the token
    ids of `prompt`; label(token_id) names a token (see token_label)."""
    labels = [label(token_id) for token_id in ids]
    sections = [
        tokens_section(prompt, ids, labels),
        shapes_section(steps, hparams, layer),
        head_section(steps, labels, layer, head),
        prediction_section(steps["logits"][-1], label),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def tokens_section(prompt, ids, labels):  # -> lines: each token's position, id and text
    lines = [f"1. Tokens: the prompt is {plural(len(ids), 'token')}"]
    if not prompt:
        lines[0] += " (an empty prompt starts from <|endoftext|>, as generate does)"
    lines.append(f"  {'position':>8}  {'id':>6}  token")
    lines += [f"  {position:>8}  {token_id:>6}  {label}" for position, (token_id, label) in enumerate(zip(ids, labels))]
    return lines


def shapes_section(steps, hparams, layer):  # -> lines: the shape of every step, in the order the code runs it
    n_head, n_layer = hparams["n_head"], hparams["n_layer"]
    d_head = hparams["n_embd"] // n_head
    n_seq, width = steps["c_attn"].shape
    before = [
        ("embed", "wte[inputs]", "token embeddings", shape(steps["wte"])),
        ("embed", "wpe[positions]", "position embeddings", shape(steps["wpe"])),
        ("embed", "wte[inputs] + wpe[positions]", "x, the residual stream", shape(steps["embed"])),
        ("causal_mask", "causal_mask(n_seq, n_seq)", "-inf above the diagonal", shape(steps["mask"])),
    ]
    one_block = [
        ("layer_norm", "layer_norm(x, **ln_1)", "", shape(steps["ln_1"])),
        ("linear", "linear(·, **c_attn)", "q, k, v side by side", shape(steps["c_attn"])),
        ("split_heads", "split into q, k, v", "thirds of the last axis", f"3 × [{n_seq}, {width // 3}]"),
        ("split_heads", f"split into {n_head} heads", f"q, k, v: {n_head} heads of {d_head} each",
         shape(steps["qkv"])),
        ("attention_scores", "attention_scores(q, k)", "q·kᵀ / √d_head, per head", shape(steps["scores"])),
        ("softmax", "softmax(scores + mask)", "attention weights", shape(steps["weights"])),
        ("attention", "attention(q, k, v, mask)", "weights · v, per head", shape(steps["heads"])),
        ("merge_heads", "merge_heads(·)", "the heads side by side", shape(steps["merge_heads"])),
        ("linear", "linear(·, **c_proj)", "mha's output", shape(steps["attn"])),
        ("block", "x + mha(...)", "residual", shape(steps["attn_residual"])),
        ("layer_norm", "layer_norm(x, **ln_2)", "", shape(steps["ln_2"])),
        ("linear", "linear(·, **c_fc)", "4× wider", shape(steps["c_fc"])),
        ("gelu", "gelu(·)", "", shape(steps["gelu"])),
        ("linear", "linear(·, **c_proj)", "ffn's output, back to n_embd", shape(steps["mlp"])),
        ("block", "x + ffn(...)", "residual: the block's output", shape(steps["out"])),
    ]
    after = [
        ("transformer", f"× {n_layer}", f"block after block, {plural(n_layer, 'layer')}", shape(steps["out"])),
        ("layer_norm", "layer_norm(x, **ln_f)", "", shape(steps["ln_f"])),
        ("lm_head", "lm_head(x, wte)", "x · wteᵀ: one logit per vocabulary token", shape(steps["logits"])),
    ]
    def row_lines(rows):
        return [f"  {function:<18} {step:<30} {step_shape:<18} {what}".rstrip()
                for function, step, what, step_shape in rows]

    return ["2. Shape flow: one forward pass of gpt2(), step by step (search model.py for the function's name)",
            f"  {'function':<18} {'step':<30} {'shape':<18} what", *row_lines(before),
            f"  -- block {layer}: one block; the {plural(n_layer, 'block')} all have these shapes --",
            *row_lines(one_block), *row_lines(after)]


def shape(array):  # -> "[5, 768]"
    return "[" + ", ".join(map(str, array.shape)) + "]"


def head_section(steps, labels, layer, head):  # -> lines: one head's attention, matrix by matrix
    n_seq = len(steps["mask"])
    d_head = steps["qkv"].shape[-1]
    shown = min(n_seq, SHOWN)
    lines = [
        f"3. One head, step by step: layer {layer}, head {head} (d_head = {d_head})",
        "  Rows are the queries (the token that looks), columns the keys (the tokens it looks at).",
        f"  q, k, v of this head: split_heads(c_attn)[:, {head}], {shape(steps['qkv'][0, head])} each",
    ]
    if n_seq > SHOWN:
        lines.append(f"  (a long prompt: showing the first {shown} of {n_seq} positions, the top-left corner; the "
                     "row sums cover whole rows)")
    corner = (slice(0, shown), slice(0, shown))
    matrices = [
        ("q·kᵀ: each query dotted with each key", steps["qk"][head], 2),
        (f"÷ √d_head = √{d_head} = {math.sqrt(d_head):g}: attention_scores(q, k)", steps["scores"][head], 2),
        ("causal_mask: 0 where a query may look, -inf at later positions", steps["mask"], 0),
        ("masked scores: scores + mask", steps["masked"][head], 2),
    ]
    for title, matrix, digits in matrices:
        lines += ["", f"  {title}"] + matrix_lines(matrix[corner], labels[:shown], labels[:shown], digits)
    weights = steps["weights"][head]
    lines += ["", "  softmax(masked scores): the attention weights; every row sums to 1, and the future gets exactly 0"]
    lines += matrix_lines(weights[corner], labels[:shown], labels[:shown], 3, row_sums=weights.sum(-1)[:shown])
    n_dims = min(d_head, SHOWN)
    lines += ["", f"  attention(q, k, v, mask): weights · v, this head's output (first {n_dims} of {d_head} dims)"]
    dims = [f"dim {dim}" for dim in range(n_dims)]
    lines += matrix_lines(steps["heads"][head, :shown, :n_dims], labels[:shown], dims, 3)
    lines += ["", "  Dropout: none. The blog posts drop weights at random in training; GPT-2 inference uses them all."]
    return lines


def matrix_lines(matrix, row_labels, column_labels, digits, row_sums=None):  # [n_rows, n_cols] -> lines
    # a fixed-width table: each column as wide as its widest entry, labels cut to fit
    cells = [[number(value, digits) for value in row] for row in matrix]
    width = max(9, *(len(cell) + 1 for row in cells for cell in row))
    header = "".join(f"{cut(label, width - 1):>{width}}" for label in column_labels)
    lines = [f"  {'':<{LABEL_WIDTH + 4}}{header}" + (f"{'row sum':>9}" if row_sums is not None else "")]
    for position, (label, row) in enumerate(zip(row_labels, cells)):
        line = f"  {position:>3} {label:<{LABEL_WIDTH}}" + "".join(f"{cell:>{width}}" for cell in row)
        lines.append(line + (f"{row_sums[position]:>9.4f}" if row_sums is not None else ""))
    return lines


def number(value, digits):  # -> text of one matrix entry
    if value == 0:
        return "0"  # exactly: the softmax of -inf, told apart from a small weight that rounds to 0.000
    if np.isinf(value):
        return str(float(value))  # "-inf", the mask
    return f"{value:.{digits}f}"


def cut(text, width):  # -> text of at most width characters, ending in "…" when shortened
    return text if len(text) <= width else text[: width - 1] + "…"


def prediction_section(last_logits, label):  # -> lines: the TOP_K most likely next tokens
    probabilities = softmax(last_logits)
    top = np.argsort(-probabilities, kind="stable")[:TOP_K]
    lines = [f"4. The prediction: the {TOP_K} most likely next tokens, softmax(logits[-1])",
             f"  {'rank':>4}  {'id':>6}  {'token':<{LABEL_WIDTH}}  probability"]
    lines += [f"  {rank:>4}  {token_id:>6}  {label(token_id):<{LABEL_WIDTH}}  {probabilities[token_id]:.4f}"
              for rank, token_id in enumerate(top, 1)]
    return lines


def token_label(tokenizer, token_id):  # -> a token's text, repr-quoted so whitespace shows, at most LABEL_WIDTH chars
    raw = tokenizer.token_bytes(token_id)
    try:
        label = repr(raw.decode("utf-8"))
    except UnicodeDecodeError:  # a piece of a character split over several tokens: its bytes
        label = repr(raw)
    return label if len(label) <= LABEL_WIDTH else label[: LABEL_WIDTH - 2] + "…" + label[-1]


# --- The picture ---


def attention_figure(weights, heads, labels, title):  # [n_shown, n_seq, n_seq] -> matplotlib Figure
    """A heatmap of each head's weights in a grid (one head: one large map), tokens as tick labels; the masked upper
    triangle is left empty (transparent), not drawn as zeros."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    n_shown, n_seq = len(weights), weights.shape[-1]
    n_cols = math.ceil(math.sqrt(n_shown))
    n_rows = math.ceil(n_shown / n_cols)
    side = 5.5 if n_shown == 1 else 2.6  # inches per map
    figure = Figure(figsize=(side * n_cols + 1.2, side * n_rows + 0.8), layout="constrained")
    axes = figure.subplots(n_rows, n_cols, squeeze=False).ravel()
    colours = colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))
    future = np.isinf(causal_mask(n_seq, n_seq))  # the mask decides what is empty: a weight that underflowed is drawn
    ticks = np.arange(0, n_seq, math.ceil(n_seq / MAX_TICKS))
    font = 8 if n_shown == 1 else 6
    for index, (ax, head_weights, head) in enumerate(zip(axes, weights, heads)):
        image = ax.imshow(np.ma.masked_array(head_weights, future), cmap=colours, vmin=0, vmax=1)
        ax.set_title(f"head {head}", fontsize=font + 2)
        ax.set_xticks(ticks, [labels[i] for i in ticks] if index + n_cols >= n_shown else [], rotation=90,
                      fontsize=font)  # labelled on the bottom map of each column
        ax.set_yticks(ticks, [labels[i] for i in ticks] if index % n_cols == 0 else [], fontsize=font)
    for ax in axes[n_shown:]:
        ax.set_axis_off()
    if n_shown == 1:
        axes[0].set_xlabel("key: the token looked at")
        axes[0].set_ylabel("query: the token looking")
    figure.colorbar(image, ax=axes[:n_shown].tolist(), shrink=0.8, label="attention weight")
    figure.suptitle(title)
    return figure


def save_figure(figure, path):  # -> None; path then holds the whole image, or is left as it was
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    suffix = path.suffix.lower()[1:]
    try:
        figure.savefig(temporary, format=suffix, metadata={"Date": None} if suffix == "svg" else None)
        os.replace(temporary, path)
    except OSError as error:
        raise UsageError(f"cannot write the plot {path}: {error.strerror or error}") from None
    finally:
        temporary.unlink(missing_ok=True)


def check_plot_file(path):  # -> None; UsageError for an unknown suffix, a missing folder, or no matplotlib
    if path.is_dir():
        raise UsageError(f"--plot {path} is a folder: name a .png or .svg file")
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {path}: the file name must end in .png or .svg (got "
                         f"{repr(path.suffix) if path.suffix else 'no suffix'})")
    if not path.parent.is_dir():
        raise UsageError(f"--plot {path}: the folder {path.parent} does not exist; create it or choose another file")
    try:
        import matplotlib  # noqa: F401 (only its presence is checked here)
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, an optional extra: {PLOT_INSTALL}") from None


# --- The command line ---


def head_number(text):  # -> int, or "all"; argparse reports a ValueError as "invalid head number or 'all' value"
    return text if text == "all" else int(text)


head_number.__name__ = "head number or 'all'"


def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(
        prog="python -m gpt2_numpy.explain",
        description="Show GPT-2 attention at work on a prompt: its tokens, the shape of every step of the forward "
        "pass, one head's attention step by step, and the next-token prediction.",
        dash_hint='a prompt that begins with \'-\' goes last, after \'--\': python -m gpt2_numpy.explain -- "-x"',
    )
    parser.add_argument("prompt", metavar="PROMPT",
                        help='the text to explain; "-" reads stdin; "" starts from <|endoftext|>; a prompt beginning '
                        "with '-' goes last, after --")
    parser.add_argument("--layer", type=int, default=0, metavar="L", help="the layer to show, from 0 (0)")
    parser.add_argument("--head", type=head_number, default=0, metavar="H",
                        help="the head to show, from 0 (0); 'all' plots every head of the layer (and prints head 0)")
    parser.add_argument("--plot", type=Path, metavar="FILE",
                        help=f"draw the attention weights as a heatmap into FILE (.png or .svg); needs matplotlib: "
                        f"{PLOT_INSTALL}")
    add_model_args(parser)
    return parser.parse_args(argv)


def check_index(value, count, flag, noun, where=""):  # -> None, or UsageError naming the valid range
    if not 0 <= value < count:
        raise UsageError(f"{flag} {value} is out of range: this model has {plural(count, noun)}{where}, numbered 0 "
                         f"to {count - 1}")


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    text = read_prompt(args.prompt)
    if args.plot is not None:
        check_plot_file(args.plot)  # before loading: a typo in the file name should not cost a model load
    hparams, params, tokenizer = load_model(args)
    check_index(args.layer, hparams["n_layer"], "--layer", "layer")
    heads = list(range(hparams["n_head"])) if args.head == "all" else [args.head]
    check_index(heads[-1], hparams["n_head"], "--head", "head", " per layer")
    ids = prompt_ids(tokenizer, text, hparams["n_vocab"])
    if len(ids) > hparams["n_ctx"]:
        raise UsageError(f"the prompt's {plural(len(ids), 'token')} exceed the model's context of {hparams['n_ctx']} "
                         "tokens: shorten it")
    if args.head == "all" and args.plot is None:
        log("note: --head all chooses what --plot draws; without --plot, head 0 is shown")
    steps = walkthrough(ids, params, hparams["n_head"], args.layer)
    label = functools.partial(token_label, tokenizer)
    write_stdout(report(text, ids, label, steps, hparams, args.layer, heads[0]))
    if args.plot is not None:
        title = f"GPT-2 attention weights, layer {args.layer}" + (f", head {heads[0]}" if len(heads) == 1 else "")
        figure = attention_figure(steps["weights"][heads], heads, [label(token_id) for token_id in ids], title)
        save_figure(figure, args.plot)
        log(f"wrote {args.plot}")
    return 0


def main(argv=None):  # entry point: errors become one line on stderr and an exit status
    sys.stdout.reconfigure(errors="replace")  # a terminal that cannot show a character gets "?", not a traceback
    run_cli(run, argv)


if __name__ == "__main__":
    main()
