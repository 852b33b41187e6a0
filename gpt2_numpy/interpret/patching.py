"""--patch: activation patching. Run a corrupted prompt, copy in one activation from the clean prompt's run, and see
how much of the clean answer comes back. The metric is the logit difference at the last position,

    m = logits[-1][A] - logits[-1][B]
    recovery = (m_patched - m_corrupt) / (m_clean - m_corrupt)      1: all of the clean answer back, 0: none

for two kinds of patch, each in a run of its own (edits.py), everything after it computed from it:
    heads   attn.z of head H in layer L, at every position           (TransformerLens's blocks.L.attn.hook_z)
    resid   the residual stream entering block L, at position p      (blocks.L.hook_resid_pre)
The two prompts have the same number of tokens, so positions correspond.
"""
import numpy as np

from gpt2_numpy.interpret.edits import Edit, constant, replace_position, resid_pre, run_with_edits
from gpt2_numpy.interpret.stepwise import fit
from gpt2_numpy.interpret.tracing import no_progress, trace
from gpt2_numpy.decode import check_finite
from gpt2_numpy.errors import UsageError


def logit_diff(logits, answers):  # [n_seq, n_vocab], (A, B) -> float: logit(A) - logit(B) at the last position
    check_finite(logits[-1])
    return float(logits[-1][answers[0]] - logits[-1][answers[1]])


def patching(clean_ids, corrupt_ids, params, n_head, answers, progress=no_progress):  # -> dict, below
    """{"clean": m_clean, "corrupt": m_corrupt, "heads": recovery [n_layer, n_head], "resid": recovery [n_layer,
    n_seq]} for prompts of token ids `clean_ids` and `corrupt_ids` (of one length) and answers (A, B).
    progress(items, total) wraps the loop over the layers. NonFiniteError for NaN or infinity; UsageError when
    m_clean = m_corrupt, which leaves nothing to recover."""
    clean = trace(clean_ids, params, n_head)
    m_clean = logit_diff(clean["logits"], answers)
    m_corrupt = logit_diff(trace(corrupt_ids, params, n_head)["logits"], answers)
    if m_clean == m_corrupt:  # every recovery would be 0 / 0
        raise UsageError(f"the two prompts give the same logit difference ({m_clean:.4g}), so there is nothing to "
                         "recover: choose a corrupt prompt that changes the answer")

    def recovery(edit):  # -> the recovery of a corrupt run with this one edit
        patched = logit_diff(run_with_edits(corrupt_ids, params, n_head, [edit])["logits"], answers)
        return (patched - m_corrupt) / (m_clean - m_corrupt) + 0.0  # + 0.0: no -0.0 where nothing changed

    heads, resid = [], []
    for layer in progress(range(len(params["blocks"])), len(params["blocks"])):
        z = clean[f"blocks.{layer}.attn.z"]
        heads.append([recovery(Edit(f"blocks.{layer}.attn.z", constant(z[head]), head)) for head in range(n_head)])
        stream = clean[resid_pre(layer)]
        resid.append([recovery(Edit(resid_pre(layer), replace_position(position, stream[position])))
                      for position in range(len(clean_ids))])
    return {"clean": m_clean, "corrupt": m_corrupt, "heads": np.array(heads), "resid": np.array(resid)}


def patching_json(clean_ids, corrupt_ids, answers, result):  # -> the JSON-ready object --patch --json prints
    return {"clean_ids": [int(token_id) for token_id in clean_ids],
            "corrupt_ids": [int(token_id) for token_id in corrupt_ids],
            "answer_ids": [int(answer) for answer in answers], "clean_logit_diff": result["clean"],
            "corrupt_logit_diff": result["corrupt"], "heads": result["heads"].tolist(),
            "resid": result["resid"].tolist()}


RESID_COLUMNS = 12  # positions shown in the resid table: a longer prompt shows its last ones
CELL = 8  # characters per column


def patching_table(clean_ids, corrupt_ids, answers, result, label):  # -> the text --patch prints
    """label(token_id) names a token (token_label)."""
    a, b = (label(answer) for answer in answers)
    n_layer, n_head = result["heads"].shape
    n_seq = len(clean_ids)
    first = max(0, n_seq - RESID_COLUMNS)
    lines = [f"Activation patching: metric logit({a}) - logit({b}) at the last position: clean {result['clean']:.4f}, "
             f"corrupt {result['corrupt']:.4f}",
             "recovery = (patched - corrupt) / (clean - corrupt): 1 brings the clean answer back, 0 changes nothing",
             "", "Each head's attn.z at every position, copied from the clean run into the corrupt one:",
             f"{'layer':<7}" + "".join(f"{'head ' + str(head):>{CELL}}" for head in range(n_head))]
    lines += [f"{layer:<7}" + cells(result["heads"][layer]) for layer in range(n_layer)]
    lines += ["", "The residual stream entering block L (resid_pre) at one position, copied likewise"
              + (f" (the last {RESID_COLUMNS} of {n_seq} positions):" if first else ":"),
              f"{'layer':<7}" + "".join(f"{position:>{CELL}}" for position in range(first, n_seq))]
    lines += [f"{name:<7}" + "".join(f"{fit(label(token_id), CELL - 1):>{CELL}}" for token_id in ids[first:])
              for name, ids in (("clean", clean_ids), ("corrupt", corrupt_ids))]
    lines += [f"{layer:<7}" + cells(result["resid"][layer, first:]) for layer in range(n_layer)]
    return "\n".join(lines) + "\n"


def cells(values):  # -> the recoveries as fixed-width columns
    return "".join(f"{value:{CELL}.3f}" for value in values)

