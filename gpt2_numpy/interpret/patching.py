"""--patch: activation patching. Run a corrupted prompt, copy in one activation from the clean prompt's run, and see
how much of the clean answer comes back. The metric is the logit difference at the last position,

    m = logits[-1][A] - logits[-1][B]
    recovery = (m_patched - m_corrupt) / (m_clean - m_corrupt)      1: all of the clean answer back, 0: none

for two kinds of patch, each in a run of its own, everything after it computed from it:
    heads   attn.z of head H in layer L, at every position           (TransformerLens's blocks.L.attn.hook_z)
    resid   the residual stream entering block L, at position p      (blocks.L.hook_resid_pre)
The two prompts have the same number of tokens, so positions correspond.

Every patched run is a run_with_edits (edits.py). It is the corrupt run up to its layer L, so it starts there
(start_at_layer=L), from the corrupt run's stream entering block L, and ends at ln_f (names=["ln_f"]), whose last
position gives the two logits. The runs of one layer go in batches along a leading axis (model.py's "..."): run i of a
batch patches its own head (or position) and no other.

When clean and corrupt barely differ, |m_clean - m_corrupt| < MIN_GAP, a recovery divides whatever a patch moves by
next to nothing: result["small_gap"] says so, and the table prints the caution.
"""
import functools
from typing import NamedTuple

import numpy as np

from gpt2_numpy.interpret.attribution import check_answers
from gpt2_numpy.interpret.edits import Edit, resid_pre, run_with_edits
from gpt2_numpy.interpret.tracing import no_progress, trace, unembedding
from gpt2_numpy.checks import check_finite
from gpt2_numpy.errors import NothingToRecover

BATCH_POSITIONS = 1024  # positions in one batched walk: every run of a layer at once for a short prompt, one at a
# time for a 1024-token one, so that the memory stays that of one long pass
MIN_GAP = 0.1  # nats: below it, the prompts move the odds of A over B by under 11% (e^0.1), too little to divide by;
# a patch's side effects on m, unrelated to what the prompts change, then read as recoveries far from 0 and 1


class Prompts(NamedTuple):  # what every patched run of one patching() reads
    clean: dict  # trace's arrays of the clean prompt
    corrupt: dict  # and of the corrupt one
    params: dict
    n_head: int
    answers: tuple  # (A, B) token ids
    m_clean: float  # the metric, logit(A) - logit(B) at the last position, of the clean run
    m_corrupt: float  # and of the corrupt run


def patching(clean_ids, corrupt_ids, params, n_head, answers, progress=no_progress):  # -> dict, below
    """{"clean": m_clean, "corrupt": m_corrupt, "heads": recovery [n_layer, n_head], "resid": recovery [n_layer,
    n_seq], "small_gap": |m_clean - m_corrupt| < MIN_GAP} for prompts of token ids `clean_ids` and `corrupt_ids` (of
    one length) and answers (A, B). progress(items, total) wraps the loop over the layers. ValueError for prompts of
    different lengths or an answer outside the vocabulary; NonFiniteError for NaN or infinity; NothingToRecover when
    m_clean = m_corrupt, which leaves nothing to recover."""
    answers = check_answers(answers, params["wte"].shape[0])
    if len(clean_ids) != len(corrupt_ids):
        raise ValueError(f"the clean prompt is {len(clean_ids)} tokens and the corrupt one {len(corrupt_ids)}: "
                         "patching copies position by position, so they must be as long")
    clean, corrupt = (trace(ids, params, n_head) for ids in (clean_ids, corrupt_ids))
    m_clean, m_corrupt = (float(logit_diff(names["ln_f"], params["wte"], answers)) for names in (clean, corrupt))
    if m_clean == m_corrupt:  # every recovery would be 0 / 0
        raise NothingToRecover(m_clean)
    prompts = Prompts(clean, corrupt, params, n_head, answers, m_clean, m_corrupt)
    heads, resid = [], []
    for layer in progress(range(len(params["blocks"])), len(params["blocks"])):
        heads.append(head_recoveries(prompts, layer))
        resid.append(resid_recoveries(prompts, layer))
    return {"clean": m_clean, "corrupt": m_corrupt, "heads": np.array(heads), "resid": np.array(resid),
            "small_gap": abs(m_clean - m_corrupt) < MIN_GAP}


def head_recoveries(prompts, layer):  # -> float64 [n_head]: each head's attn.z patched in at every position
    z = f"blocks.{layer}.attn.z"
    # a patch that copies in the array already there is the corrupt run itself: recovery 0 exactly, where the batched
    # walk's rounding, divided by a small clean - corrupt, would print as -0.001
    same = [np.array_equal(prompts.clean[z][head], prompts.corrupt[z][head]) for head in range(prompts.n_head)]
    return np.where(same, 0.0, recoveries(prompts, prompts.n_head, functools.partial(heads_batch, prompts, layer)))


def resid_recoveries(prompts, layer):  # -> float64 [n_seq]: the stream entering the layer patched at each position
    stream = resid_pre(layer)
    same = np.all(prompts.clean[stream] == prompts.corrupt[stream], axis=-1)
    row = np.where(same, 0.0, recoveries(prompts, len(same), functools.partial(resid_batch, prompts, layer)))
    if np.sum(~same) == 1:  # the one row that differs, copied in, makes the clean run itself: 1 exactly
        row[~same] = 1.0
    return row


def heads_batch(prompts, layer, runs):  # -> float64 [len(runs)]: run i, the corrupt run with head runs[i]'s clean z
    z = f"blocks.{layer}.attn.z"
    patch = Edit(z, functools.partial(one_each, runs=runs, source=prompts.clean[z]))
    return patched_logit_diff(prompts, layer, copies(prompts.corrupt[resid_pre(layer)], len(runs)), [patch])


def resid_batch(prompts, layer, runs):  # -> float64 [len(runs)]: run i, the stream with clean position runs[i]
    stream = resid_pre(layer)
    patched = one_each(copies(prompts.corrupt[stream], len(runs)), runs, prompts.clean[stream])
    return patched_logit_diff(prompts, layer, patched, [])


def patched_logit_diff(prompts, layer, stream, edits):  # [runs, n_seq, n_embd] entering `layer` -> float64 [runs]
    # the runs are the corrupt run up to there, so the blocks before are not run again; ln_f is the last array needed
    normed = run_with_edits(stream, prompts.params, prompts.n_head, edits, start_at_layer=layer, names=["ln_f"])
    return logit_diff(normed["ln_f"], prompts.params["wte"], prompts.answers)


def recoveries(prompts, count, batch):  # batch(runs) -> logit diffs: -> float64 [count], batch by batch
    patched = np.concatenate([batch(runs) for runs in batches(count, len(prompts.clean["embed"]))])
    return (patched - prompts.m_corrupt) / (prompts.m_clean - prompts.m_corrupt) + 0.0  # + 0.0: no -0.0


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
