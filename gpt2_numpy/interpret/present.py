"""What explain prints of each technique: a table for a reader, or (--json) one JSON-ready object for a program, from
the numbers the technique modules compute (lens.py, heads.py, ablation.py, attribution.py, patching.py). Nothing here
runs the model. label(token_id) names a token for a table (stepwise.token_label: quoted, cut to fit), text(token_id)
gives its text for JSON.
"""
import math

from gpt2_numpy.console import plural
from gpt2_numpy.interpret.heads import PATTERNS, prompt_scores, repeat_scores, uniform_weights
from gpt2_numpy.interpret.patching import MIN_GAP
from gpt2_numpy.interpret.stepwise import cut, fit


def ids_json(ids):  # -> token ids as JSON's plain integers
    return [int(token_id) for token_id in ids]


def json_number(value):  # -> a float, or None for NaN (JSON has no NaN)
    return None if math.isnan(value) else float(value)


# --- The logit lens (lens.top_tokens's layers) ---

LENS_CELL = 17  # characters per column
HIT = "*"  # marks a cell whose top token is the one that actually comes next


def lens_table(ids, layers, label):  # layers: per layer (top ids, probabilities) at the last positions -> the text
    n_seq, n_shown = len(ids), len(layers[0][0])
    positions = range(n_seq - n_shown, n_seq)
    lines = [f"Logit lens: the likeliest next token after each layer, and its probability; {HIT}: the token that "
             "comes next"]
    if n_shown < n_seq:
        lines.append(f"(a long prompt: showing the last {n_shown} of {n_seq} positions)")
    lines.append("")
    rows = [("position", [str(position) for position in positions]),
            ("token", [fit(label(ids[position]), LENS_CELL - 1) for position in positions]),
            ("next", [fit(label(ids[position + 1]), LENS_CELL - 1) if position + 1 < n_seq else "?"
                      for position in positions]),
            ("", ["-" * (LENS_CELL - 1)] * len(positions))]
    for name, (top, probabilities) in zip(["embed", *map(str, range(len(layers) - 1))], layers):
        hits = [position + 1 < n_seq and token_id == ids[position + 1] for position, token_id in zip(positions, top)]
        rows.append((name, list(map(lens_cell, map(label, top), probabilities, hits))))
    for name, cells in rows:
        lines.append(f"  {name:<8}" + "".join(f"{cut(cell, LENS_CELL - 1):>{LENS_CELL}}" for cell in cells).rstrip())
    return "\n".join(lines) + "\n"


def lens_cell(label, probability, hit):  # -> "' the' 0.42*": a label cut to fit, its probability, the mark
    mark = HIT if hit else " "
    return f"{fit(label, LENS_CELL - 7)} {probability:.2f}{mark}"


def lens_json(ids, layers, text):  # layers at every position -> the object --lens --json prints
    """For each layer ("embed" for the embeddings, then 0, 1, ...), the top next token's id, text and probability at
    each position."""
    names = ["embed", *range(len(layers) - 1)]
    return {"prompt_ids": ids_json(ids),
            "layers": [{"layer": name, "top_ids": top.tolist(), "top_texts": [text(token_id) for token_id in top],
                        "probabilities": probabilities.tolist()} for name, (top, probabilities) in zip(names, layers)]}


# --- Head scores (heads.head_scores's) ---

SCORE_COLUMN = 10  # characters per score column


def heads_json(ids, repeated, scores, layers):  # -> the object --heads --json prints (and the page holds), for `layers`
    rows = [{"layer": layer, "head": head, **{pattern: json_number(scores[pattern][layer, head])
                                              for pattern in PATTERNS}}
            for layer in layers for head in range(scores["self"].shape[1])]
    return {"prompt_ids": ids_json(ids), "repeated_ids": ids_json(repeated), "heads": rows}


def heads_table(ids, repeated, scores, layers, seed):  # -> the table's text: a row per head of `layers`
    length = (len(repeated) - 1) // 2
    uniform = {**prompt_scores(uniform_weights(len(ids))), **repeat_scores(uniform_weights(len(repeated)), length)}
    lines = ["Head scores: the mean attention weight each head gives the key a pattern names",
             f"(previous, first, self: the prompt's {plural(len(ids), 'token')}; duplicate, induction: "
             f"<|endoftext|> and {length} random tokens fed twice, seed {seed})", "",
             "layer head" + "".join(f"{name:>{SCORE_COLUMN}}" for name in ("previous", "first", "self", "duplicate",
                                                                           "induction")),
             "  uniform " + score_cells(uniform[pattern] for pattern in PATTERNS)]
    lines += [f"{layer:5} {head:4}" + score_cells(scores[pattern][layer, head] for pattern in PATTERNS)
              for layer in layers for head in range(scores["self"].shape[1])]
    return "\n".join(lines) + "\n"


def score_cells(values):  # -> the scores as fixed-width columns; "-" for a score that does not exist (NaN)
    return "".join(f"{'-':>{SCORE_COLUMN}}" if math.isnan(value) else f"{value:{SCORE_COLUMN}.3f}" for value in values)


# --- Ablation (ablation.ablation's result: {"before", "after"}, each (loss, top ids, probabilities)) ---


def ablation_json(ids, heads, how, result, text, windows=None):  # -> the object --ablate --json prints
    """windows: the reference's window count, for a mean ablation. "loss" is null for a one-token prompt, which has
    no next token inside it."""
    return {"prompt_ids": ids_json(ids), "ablated": [[layer, head] for layer, head in heads], "ablation": how,
            **({"mean_windows": windows} if how == "mean" else {}), **before_after_json(result, text)}


def before_after_json(result, text):  # -> {"loss", "next_token"} of an edited run's {"before", "after"}
    # "loss" is null for a one-token prompt, which has no next token inside it
    loss = None if math.isnan(result["before"][0]) else {when: result[when][0] for when in ("before", "after")}
    return {"loss": loss, "next_token": {when: [{"id": int(token_id), "token": text(token_id), "prob": float(prob)}
                                                for token_id, prob in zip(*result[when][1:])]
                                         for when in ("before", "after")}}


def ablation_table(ids, heads, how, result, label, windows=None):  # -> the text --ablate prints
    names = ", ".join(f"{layer}.{head}" for layer, head in heads)
    whose = "head {}: its" if len(heads) == 1 else "heads {}: each head's"
    done = ("set to zero at every position" if how == "zero" else
            f"replaced by its mean at each position over {plural(windows, 'window')} of the reference text")
    return before_after_table(f"Ablation of {whose.format(names + ' (layer.head)')} attn.z {done}", result, label)


def before_after_table(title, result, label):  # -> title, the loss and the likeliest next tokens, before and after
    (loss_before, top_before, probs_before), (loss_after, top_after, probs_after) = result["before"], result["after"]
    lines = [title, ""]
    if math.isnan(loss_before):
        lines.append("mean next-token loss: none (a prompt of one token has no next token inside it)")
    else:
        lines.append(f"mean next-token loss over the prompt: {loss_before:.4f} before, {loss_after:.4f} after "
                     f"({loss_after - loss_before:+.4f})")
    lines += ["", f"{'':4}{'before':>28}{'after':>28}"]
    for rank, row in enumerate(zip(top_before, probs_before, top_after, probs_after), start=1):
        lines.append(f"{rank:4}" + "".join(f"{fit(label(token_id), 19):>20} {prob:7.4f}"
                                           for token_id, prob in zip(row[::2], row[1::2])))
    return "\n".join(lines) + "\n"


# --- Direct logit attribution (attribution.attribution's logit difference and terms) ---


def attribution_json(ids, answers, logit_diff, terms):  # -> the object --attribute --json prints
    return {"prompt_ids": ids_json(ids), "answer_ids": ids_json(answers), "logit_diff": logit_diff,
            "terms": [{"name": name, "value": value} for name, value in terms]}


def attribution_table(answers, logit_diff, terms, label):  # -> the text --attribute prints
    a, b = (label(answer) for answer in answers)
    lines = [f"Direct logit attribution: logit({a}) - logit({b}) = {logit_diff:.4f} at the last position,",
             "split into what each part wrote into the residual stream (through ln_f), largest first", ""]
    lines += [f"  {name:<24}{value:>10.4f}" for name, value in sorted(terms, key=lambda term: -abs(term[1]))]
    lines += [f"  {'':<24}{'-' * 10}", f"  {'sum':<24}{sum(value for _, value in terms):>10.4f}"]
    return "\n".join(lines) + "\n"


# --- Activation patching (patching.patching's result) ---

RESID_COLUMNS = 12  # positions shown in the resid table: a longer prompt shows its last ones
PATCH_CELL = 8  # characters per column


def patching_json(clean_ids, corrupt_ids, answers, result):  # -> the object --patch --json prints
    return {"clean_ids": ids_json(clean_ids), "corrupt_ids": ids_json(corrupt_ids), "answer_ids": ids_json(answers),
            "clean_logit_diff": result["clean"], "corrupt_logit_diff": result["corrupt"],
            "small_gap": bool(result["small_gap"]), "heads": result["heads"].tolist(),
            "resid": result["resid"].tolist()}


def small_gap_caution(result):  # -> the caution a table prints when clean and corrupt barely differ
    gap = abs(result["clean"] - result["corrupt"])
    return (f"caution: clean and corrupt differ by {gap:.2g}, under {MIN_GAP} (the "
            "odds of A over B move by under 11%): each recovery\ndivides what a patch moves by next to nothing, so "
            "these say little; choose prompts that change the answer more")


def patching_table(clean_ids, corrupt_ids, answers, result, label):  # -> the text --patch prints
    a, b = (label(answer) for answer in answers)
    n_layer, n_head = result["heads"].shape
    n_seq = len(clean_ids)
    first = max(0, n_seq - RESID_COLUMNS)
    lines = [f"Activation patching: metric logit({a}) - logit({b}) at the last position: clean {result['clean']:.4f}, "
             f"corrupt {result['corrupt']:.4f}",
             "recovery = (patched - corrupt) / (clean - corrupt): 1 brings the clean answer back, 0 changes nothing"]
    lines += [small_gap_caution(result)] * bool(result["small_gap"])
    lines += ["", "Each head's attn.z at every position, copied from the clean run into the corrupt one:",
              f"{'layer':<7}" + "".join(f"{'head ' + str(head):>{PATCH_CELL}}" for head in range(n_head))]
    lines += [f"{layer:<7}" + recovery_cells(result["heads"][layer]) for layer in range(n_layer)]
    lines += ["", "The residual stream entering block L (resid_pre) at one position, copied likewise"
              + (f" (the last {RESID_COLUMNS} of {n_seq} positions):" if first else ":"),
              f"{'layer':<7}" + "".join(f"{position:>{PATCH_CELL}}" for position in range(first, n_seq))]
    lines += [f"{name:<7}" + "".join(f"{fit(label(token_id), PATCH_CELL - 1):>{PATCH_CELL}}"
                                     for token_id in ids[first:])
              for name, ids in (("clean", clean_ids), ("corrupt", corrupt_ids))]
    lines += [f"{layer:<7}" + recovery_cells(result["resid"][layer, first:]) for layer in range(n_layer)]
    return "\n".join(lines) + "\n"


def recovery_cells(values):  # -> the recoveries as fixed-width columns
    return "".join(f"{value:{PATCH_CELL}.3f}" for value in values)
