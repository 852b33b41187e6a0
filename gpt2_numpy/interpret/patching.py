"""--patch: activation patching. Run a corrupted prompt, copy in one activation from the clean prompt's run, and see
how much of the clean answer comes back. The metric is the logit difference at the last position,

    m = logits[-1][A] - logits[-1][B]
    recovery = (m_patched - m_corrupt) / (m_clean - m_corrupt)      1: all of the clean answer back, 0: none

for two kinds of patch, each in a run of its own, everything after it computed from it:
    heads   attn.z of head H in layer L, at every position           (TransformerLens's blocks.L.attn.hook_z)
    resid   the residual stream entering block L, at position p      (blocks.L.hook_resid_pre)
The two prompts have the same number of tokens, so positions correspond.

A patched run is the corrupt run up to its layer L, so it starts there, from the corrupt run's stream entering block L
(tracing.block_traces with first=L), and ends at the last position's two logits. The runs of one layer go in batches
along a leading axis (model.py's "..."): run i of a batch patches its own head (or position) and no other.
"""
import functools

import numpy as np

from gpt2_numpy.interpret.edits import Edit, apply_edits, resid_pre
from gpt2_numpy.interpret.stepwise import fit
from gpt2_numpy.interpret.tracing import block_traces, no_progress, trace, unedited, unembedding
from gpt2_numpy.checks import check_finite
from gpt2_numpy.errors import NothingToRecover
from gpt2_numpy.model import layer_norm

BATCH_POSITIONS = 1024  # positions in one batched walk: every run of a layer at once for a short prompt, one at a
# time for a 1024-token one, so that the memory stays that of one long pass


def patching(clean_ids, corrupt_ids, params, n_head, answers, progress=no_progress):  # -> dict, below
    """{"clean": m_clean, "corrupt": m_corrupt, "heads": recovery [n_layer, n_head], "resid": recovery [n_layer,
    n_seq]} for prompts of token ids `clean_ids` and `corrupt_ids` (of one length) and answers (A, B).
    progress(items, total) wraps the loop over the layers. NonFiniteError for NaN or infinity; NothingToRecover when
    m_clean = m_corrupt, which leaves nothing to recover."""
    clean, corrupt = (trace(ids, params, n_head) for ids in (clean_ids, corrupt_ids))
    m_clean, m_corrupt = (float(logit_diff(names["ln_f"], params["wte"], answers)) for names in (clean, corrupt))
    if m_clean == m_corrupt:  # every recovery would be 0 / 0
        raise NothingToRecover(m_clean)

    def recovery(patched):  # float64 [runs] -> the recoveries of patched runs' logit differences
        return (patched - m_corrupt) / (m_clean - m_corrupt) + 0.0  # + 0.0: no -0.0 where nothing changed

    def recoveries(layer, count, runs_from):  # -> [count]: the recovery of each run of this layer, batch by batch
        return np.concatenate([recovery(walk_from(params, n_head, answers, layer, *runs_from(runs)))
                               for runs in batches(count, len(clean_ids))])

    heads, resid = [], []
    for layer in progress(range(len(params["blocks"])), len(params["blocks"])):
        z, stream = f"blocks.{layer}.attn.z", resid_pre(layer)

        def heads_runs(runs):  # -> the corrupt stream entering the layer, and the edit: run i gets head runs[i]
            patch = Edit(z, functools.partial(one_each, runs=runs, source=clean[z]))
            return copies(corrupt[stream], len(runs)), functools.partial(apply_edits, [patch])

        def resid_runs(runs):  # -> the corrupt stream, run i with position runs[i] from the clean stream
            return (one_each(copies(corrupt[stream], len(runs)), runs, clean[stream]),)

        # a patch that copies in the array already there is the corrupt run itself: recovery 0 exactly, where the
        # batched walk's rounding, divided by a small clean - corrupt, would print as -0.001
        same_heads = [np.array_equal(clean[z][head], corrupt[z][head]) for head in range(n_head)]
        heads.append(np.where(same_heads, 0.0, recoveries(layer, n_head, heads_runs)))
        same_rows = np.all(clean[stream] == corrupt[stream], axis=-1)
        row = np.where(same_rows, 0.0, recoveries(layer, len(clean_ids), resid_runs))
        if np.sum(~same_rows) == 1:  # the one row that differs, copied in, makes the clean run itself: 1 exactly
            row[~same_rows] = 1.0
        resid.append(row)
    return {"clean": m_clean, "corrupt": m_corrupt, "heads": np.array(heads), "resid": np.array(resid)}


def walk_from(params, n_head, answers, layer, stream, edit=unedited):  # [runs, n_seq, n_embd] -> float64 [runs]
    """The logit differences of runs that enter block `layer` with `stream`, edit(name, array) applied as trace applies
    it: the runs are the corrupt run up to there, so the blocks before are not run again."""
    for steps in block_traces(stream, params["blocks"], n_head, edit, first=layer):
        stream = steps["out"]  # only the stream goes on: each block's other arrays are dropped as the walk moves
    return logit_diff(layer_norm(stream, **params["ln_f"]), params["wte"], answers)


def logit_diff(normed, wte, answers):  # [..., n_seq, n_embd] (ln_f's output), (A, B) -> float64 [...]
    # logits[-1][A] - logits[-1][B], from the last position's logits of A and B alone: all of them would be n_vocab
    # products per position where the metric needs two
    logits = unembedding(normed[..., -1, :], wte[list(answers)])  # [..., 2]
    check_finite(logits)
    return (logits[..., 0] - logits[..., 1]).astype(np.float64)


def batches(count, n_seq):  # -> iterator of int arrays: runs 0 .. count-1, BATCH_POSITIONS positions at a time
    size = max(1, BATCH_POSITIONS // n_seq)
    return (np.arange(start, min(start + size, count)) for start in range(0, count, size))


def copies(stream, n_runs):  # [n_seq, n_embd] -> [n_runs, n_seq, n_embd], read only: one run's stream per row
    return np.broadcast_to(stream, (n_runs, *stream.shape))


def one_each(array, runs, source):  # [n_runs, n, ...], [n_runs], [n, ...] -> a copy: [i, runs[i]] from source
    """Run i of a batch patched at item runs[i] (a head, a position) with the clean run's: the other runs' arrays, and
    the caller's, keep their values."""
    array = array.copy()
    array[np.arange(len(runs)), runs] = source[runs]
    return array


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

