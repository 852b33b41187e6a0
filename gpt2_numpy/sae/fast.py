"""The topk SAE's training step, tuned: model.py's loss_and_grads for architecture "topk", the same losses and
gradients computed from each row's k latents (indices and values) instead of a mostly-zero [n, d_sae] array.
tests/unit/sae/test_fast.py holds the two equal; model.py is the one to read.
"""
import numpy as np

from gpt2_numpy import cores
from gpt2_numpy.circuits.transcoders import skip
from gpt2_numpy.sae.model import AUX_COEFFICIENT, aux_k, batch_stats, has_aux, mse, top_k_indices

GROUP = 8  # latents per group in top_k_grouped


def top_k_grouped(x, k):  # [n, m] -> int [n, k]: where each row's k largest values are, as sae.top_k_indices
    # a partial sort of every row's m values is most of a step's time; the k largest lie in the k groups whose largest
    # member is largest (each of them is at least its own value), so the sort runs on the groups' maxima, then on
    # those k groups' members: two small sorts and one pass of max. A group is GROUP latents m / GROUP apart, so
    # that the max runs along contiguous rows (a max over 8 neighbours would loop 8 at a time)
    n, m = x.shape
    n_groups = m // GROUP
    if m % GROUP or n_groups <= k:
        return top_k_indices(x, k)
    groups = top_k_indices(x.reshape(n, GROUP, n_groups).max(axis=1), k)  # [n, k]
    members = (groups[:, :, None] + n_groups * np.arange(GROUP)).reshape(n, k * GROUP)  # [n, k GROUP]
    return np.take_along_axis(members, top_k_indices(np.take_along_axis(x, members, axis=-1), k), axis=-1)


def scattered(values, indices, width):  # [n, k], int [n, k] -> [n, width]: values at indices, zero elsewhere
    dense = np.zeros((len(values), width), values.dtype)
    np.put_along_axis(dense, indices, values, axis=-1)
    return dense


def topk_loss_and_grads(x, params, k, dead=None, apply_b_dec_to_input=True, target=None, batch_threshold=False):
    # -> (losses, grads, stats), as sae.loss_and_grads(..., "topk"); with batch_threshold, stats also "threshold":
    # the pre-activation that the batch's n k largest reach (BatchTopK's), where a JumpReLU keeps k a row on average
    W_enc, b_enc, W_dec, b_dec = params["W_enc"], params["b_enc"], params["W_dec"], params["b_dec"]
    n, d_sae = x.shape[0], W_enc.shape[1]
    y = x if target is None else target
    x_in = x - b_dec if apply_b_dec_to_input else x
    pre = x_in @ W_enc
    pre += b_enc  # in place: [n, d_sae] is the step's largest array
    latents = top_k_grouped(pre, k)  # [n, k]
    values = np.maximum(np.take_along_axis(pre, latents, axis=-1), 0)  # [n, k]: f's nonzero entries, and zeros
    rows = W_dec[latents]  # [n, k, d_in]: the decoder rows each activation uses
    x_hat = (values[:, None, :] @ rows)[:, 0] + b_dec + skip(params, x)  # Σ over its k latents of f_j W_dec[j]
    losses = {"mse": mse(x_hat, y)}
    d_x_hat = (x_hat - y) * np.float32(2 / n)
    d_values = (rows @ d_x_hat[:, :, None])[..., 0] * (values > 0)  # [n, k]: f's gradient at its k latents
    # the gradients of W_dec and W_enc gather, for each latent, the rows that used it: one product each with the
    # [n, d_sae] arrays the k values make. Transposed first: OpenBLAS multiplies [d_in, n] by [n, d_sae] far slower
    # than [d_sae, n] by [n, d_in]
    d_W_dec = scattered(values, latents, d_sae).T @ d_x_hat
    d_pre = scattered(d_values, latents, d_sae)
    if has_aux(x.shape[-1], dead):  # the AuxK loss, from each row's k_aux dead latents in the same way
        dead_ids = np.flatnonzero(dead)
        k_aux, scale = aux_k(x.shape[-1], len(dead_ids))
        dead_pre = pre[:, dead_ids]  # [n, n_dead]: the sort runs on the dead latents alone
        picked = top_k_indices(dead_pre, k_aux)
        aux_latents, aux_values = dead_ids[picked], np.take_along_axis(dead_pre, picked, axis=-1)  # [n, k_aux]
        aux_rows = W_dec[aux_latents]  # [n, k_aux, d_in]
        error = (aux_values[:, None, :] @ aux_rows)[:, 0] - (y - x_hat)
        losses["aux"] = AUX_COEFFICIENT * scale * float(np.mean(np.sum(error**2, axis=-1)))
        d_error = error * np.float32(AUX_COEFFICIENT * scale * 2 / n)
        d_W_dec += scattered(aux_values, aux_latents, d_sae).T @ d_error
        d_pre += scattered((aux_rows @ d_error[:, :, None])[..., 0], aux_latents, d_sae)
    d_W_enc = (d_pre.T @ x_in).T
    d_b_enc = d_pre.sum(axis=0)
    grads = {"W_enc": np.ascontiguousarray(d_W_enc), "b_enc": d_b_enc, "W_dec": d_W_dec,
             "b_dec": d_x_hat.sum(axis=0) - d_b_enc @ W_enc.T * apply_b_dec_to_input}
    if "W_skip" in params:
        grads["W_skip"] = d_x_hat.T @ x
    fired = np.bincount(latents[values > 0], minlength=d_sae) > 0
    stats = batch_stats(y, x_hat, (values > 0).sum(axis=-1), fired)
    if batch_threshold:
        stats["threshold"] = max(float(np.partition(pre, -n * k, axis=None)[-n * k]), 0.0)
    return losses, grads, stats


ROWS = 512  # a batch is worked in pieces of this many rows, whatever the team, so the sums are the same on any team


def team_loss_and_grads(x, params, k, dead=None, apply_b_dec_to_input=True, target=None, batch_threshold=False):
    # -> (losses, grads, stats), as topk_loss_and_grads(x, ...)
    # the batch's rows in pieces of ROWS, shared among the cores (cores.split), each piece's losses and gradients
    # weighted by its share of the batch and added up in order. Run within cores.all_cores(): OpenBLAS on one thread,
    # as its own threads spend more time handing over products this small than multiplying
    n = len(x)
    starts = range(0, n, ROWS)
    pieces = [None] * len(starts)

    def some_pieces(share):
        for at in range(len(starts))[share]:
            rows = slice(starts[at], starts[at] + ROWS)
            pieces[at] = topk_loss_and_grads(x[rows], params, k, dead, apply_b_dec_to_input,
                                             None if target is None else target[rows], batch_threshold)

    cores.split(some_pieces, len(starts), item_size=ROWS * params["W_enc"].size)
    weights = [min(ROWS, n - start) / n for start in starts]  # the mean over the batch is the pieces' weighted sum
    losses = {name: sum(w * piece[0][name] for w, piece in zip(weights, pieces)) for name in pieces[0][0]}
    grads = {name: sum(np.float32(w) * piece[1][name] for w, piece in zip(weights, pieces)) for name in params
             if name in pieces[0][1]}
    fired = np.logical_or.reduce([piece[2]["fired"] for piece in pieces])
    y = x if target is None else target
    stats = {"explained_variance": float(1 - n * losses["mse"] / np.sum((y - y.mean(axis=0)) ** 2)),
             **{name: sum(w * piece[2][name] for w, piece in zip(weights, pieces)) for name in pieces[0][2]
                if name in ("l0", "threshold")}, "fired": fired}  # a piece's threshold: of its rows
    return losses, grads, stats
