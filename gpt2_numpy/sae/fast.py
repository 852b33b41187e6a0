"""The topk SAE's training step, tuned: model.py's loss_and_grads for architecture "topk", the same losses and
gradients computed from each row's k latents (indices and values) instead of mostly-zero [n, d_sae] arrays.
tests/unit/sae/test_fast.py holds the two equal; model.py is the one to read.

Of the textbook's five products with [n, d_sae] arrays, one is left: the encoder's, pre = x_in W_enc, whose every
entry the top-k reads. The other four have only n k nonzeros on their [n, d_sae] side (f, d_pre): decoding reads each
row's k decoder rows, and the two weight gradients are sums over the (row, latent) pairs (latent_sums), for GPT-2
small's residual (768 -> 24,576 latents, k 32) about d_sae / k = 768 times less work than the dense products.
"""
import numpy as np

from gpt2_numpy import cores
from gpt2_numpy.allocator import HEAP_ARRAYS_UP_TO
from gpt2_numpy.sae.transcoder_model import skip
from gpt2_numpy.sae.model import AUX_COEFFICIENT, aux_k, has_aux, top_k_indices

GROUP = 8  # latents per group in top_k_grouped
LONG_ROWS = 256  # groups per row from which group_maxima reduces along the middle axis (below, member by member)
ROWS = 512  # rows per piece of the forward pass at most (piece_rows), whatever the team: each row's numbers are the
# same on any team
# a latent used by more than 1 / DENSE_SHARE of the rows has its sum taken by a dense product (its column of the
# mostly-zero matrix) rather than pair by pair: a multiply-add in OpenBLAS costs about 1 / 64 to 1 / 128 of a gathered,
# scaled and added element in NumPy's passes (measured on the project's AMD EPYC: 64 and 128 took the same time at
# both of scripts/bench/sae.py's sizes, 0 (all pair by pair) or 1,024 up to 9x longer; 128 keeps the small size's sums
# all products)
DENSE_SHARE = 128
TILE = 256  # rows per tile of transposed(): a [TILE, d] tile and its transpose stay in cache
PASS_PAIRS = 4096  # pairs per block of a pass of latent_sums at most: their [PASS_PAIRS, d] vectors stay on glibc's
# heap (under HEAP_ARRAYS_UP_TO for d up to 2,048) instead of fresh pages, each a fault


def top_k_grouped(x, k):  # [n, m] -> (int [n, k], [n, k]): where each row's k largest values are, as
    # sae.top_k_indices, and those values
    # a partial sort of every row's m values is most of a step's time; the k largest lie in the k groups whose largest
    # member is largest (each of them is at least its own value), so the sort runs on the groups' maxima, then on
    # those k groups' members: two small sorts and one pass of max. A group is GROUP latents m / GROUP apart, so
    # that the max runs along contiguous rows (a max over 8 neighbours would loop 8 at a time)
    n, m = x.shape
    n_groups = m // GROUP
    if m % GROUP or n_groups <= k:
        indices = top_k_indices(x, k)
        return indices, take_rows(x, indices)
    groups = top_k_indices(group_maxima(x, n_groups), k)  # [n, k]
    members = (groups[:, :, None] + n_groups * np.arange(GROUP)).reshape(n, k * GROUP)  # [n, k GROUP]
    member_values = take_rows(x, members)
    best = top_k_indices(member_values, k)
    return take_rows(members, best), take_rows(member_values, best)


def group_maxima(x, n_groups):  # [n, GROUP * n_groups] -> [n, n_groups]: the largest member of each group
    members = x.reshape(len(x), GROUP, n_groups)
    if n_groups >= LONG_ROWS:
        return members.max(axis=1)
    # NumPy's reduction over the middle axis loops n_groups at a time, slowly when that is short: at 512 latents
    # (64 groups) the GROUP - 1 passes of maximum take half its time; from 256 groups on, the reduction is faster
    # (measured on 512 rows, then rows of 1,024 to 16,384 latents)
    out = np.maximum(members[:, 0], members[:, 1])
    for member in range(2, GROUP):
        np.maximum(out, members[:, member], out=out)
    return out


def take_rows(x, indices):  # [n, m], int [n, j] -> [n, j]: np.take_along_axis(x, indices, axis=-1), from flat indices
    # into x (about 2x faster: take_along_axis indexes with a broadcast pair of index arrays)
    return x.ravel().take(indices + (np.arange(len(x)) * x.shape[1])[:, None])


def rows_forward(x, y, params, k, dead, n, apply_b_dec_to_input, top=0):  # [m, d_in] x2 -> {name: [m, ...]}: one
    # piece's latents, reconstruction of y and the gradients at its k latents (and k_aux AuxK latents), of losses
    # averaged over a batch of n rows; with top, "top_pre": the piece's top largest pre-activations, in no order
    W_enc, b_enc, W_dec, b_dec = params["W_enc"], params["b_enc"], params["W_dec"], params["b_dec"]
    x_in = x - b_dec if apply_b_dec_to_input else x
    pre = x_in @ W_enc
    pre += b_enc  # in place: [m, d_sae] is the step's largest array
    latents, values = top_k_grouped(pre, k)  # [m, k] each
    values = np.maximum(values, 0)  # [m, k]: f's nonzero entries, and zeros
    rows = W_dec[latents]  # [m, k, d_in]: the decoder rows each activation uses
    x_hat = (values[:, None, :] @ rows)[:, 0] + b_dec  # Σ over its k latents of f_j W_dec[j]: k rows, not d_sae
    if "W_skip" in params:  # a transcoder's skip connection (skip() would add zeros without one)
        x_hat += skip(params, x)
    error = x_hat - y
    d_x_hat = error * np.float32(2 / n)
    d_values = (rows @ d_x_hat[:, :, None])[..., 0] * (values > 0)  # [m, k]: d_pre at its k latents (ReLU's mask)
    piece = {"x_in": x_in, "latents": latents, "values": values, "d_values": d_values, "d_x_hat": d_x_hat,
             "squared_error": np.sum(error**2, axis=-1)}
    if top:  # the batch's n k largest are among its pieces' n k largest each
        piece["top_pre"] = np.partition(pre, -min(top, pre.size), axis=None)[-min(top, pre.size):]
    if has_aux(x.shape[-1], dead):  # the AuxK loss, from each row's k_aux dead latents in the same way
        dead_ids = np.flatnonzero(dead)
        k_aux, scale = aux_k(x.shape[-1], len(dead_ids))
        dead_pre = pre[:, dead_ids]  # [m, n_dead]: the sort runs on the dead latents alone
        picked = top_k_indices(dead_pre, k_aux)
        aux_latents, aux_values = dead_ids[picked], take_rows(dead_pre, picked)  # [m, k_aux]
        aux_rows = W_dec[aux_latents]  # [m, k_aux, d_in]
        aux_error = (aux_values[:, None, :] @ aux_rows)[:, 0] + error  # Σ aux_j W_dec[j] - (y - x̂)
        d_aux_error = aux_error * np.float32(AUX_COEFFICIENT * scale * 2 / n)
        piece.update(aux_latents=aux_latents, aux_values=aux_values, d_aux_error=d_aux_error,
                     d_aux_values=(aux_rows @ d_aux_error[:, :, None])[..., 0],
                     aux_squared_error=AUX_COEFFICIENT * scale * np.sum(aux_error**2, axis=-1))
    return piece


def latent_sums(ids, rows, products, d_sae):
    """int [p], int [p]: (row, latent) pairs, no two alike -> for each (weights [p], vectors [m, d], transpose) of
    products, [d_sae, d] ([d, d_sae] if transpose): row j the sum over the pairs at latent j of weights[p]
    vectors[rows[p]], which the textbook writes as the product scattered(weights)ᵀ @ vectors, of an [m, d_sae] array
    with p nonzeros. Here a latent used by more than m / DENSE_SHARE rows has its sum taken by that product with its
    column alone; the others pair by pair (pair_passes), in row order. The latents are shared among the cores."""
    m = len(products[0][1])
    dense = np.bincount(ids, minlength=d_sae) * DENSE_SHARE > m
    heavy, light = np.flatnonzero(dense[ids]), np.flatnonzero(~dense[ids])
    light = light[np.argsort(ids[light], kind="stable")]  # each latent's pairs together, in row order
    bounds = np.searchsorted(ids[light], np.arange(d_sae + 1))  # latent j's: light[bounds[j]:bounds[j + 1]]
    outs = [np.empty((vectors.shape[1], d_sae), vectors.dtype) if transpose else
            np.zeros((d_sae, vectors.shape[1]), vectors.dtype) for _, vectors, transpose in products]

    def some_latents(share):
        columns = np.flatnonzero(dense[share])  # [h]: the share's latents whose sums are products
        column_of = np.cumsum(dense[share]) - 1  # a latent's place among them
        ours = heavy[(ids[heavy] >= share.start) & (ids[heavy] < share.stop)]
        pairs = light[bounds[share.start]:bounds[share.stop]]
        at, passes = ids[pairs] - share.start, pair_passes(ids[pairs])
        for (weights, vectors, transpose), out in zip(products, outs):
            sums = np.zeros((len(dense[share]), vectors.shape[1]), vectors.dtype) if transpose else out[share]
            if len(columns):
                weight_columns = np.zeros((len(columns), m), vectors.dtype)  # [h, m]: the mostly-zero matrix's
                weight_columns[column_of[ids[ours] - share.start], rows[ours]] = weights[ours]
                sums[columns] = weight_columns @ vectors
            for picked in passes:  # a pass writes no row of sums twice, so that a fancy-indexed += adds each pair
                contributions = vectors[rows[pairs[picked]]]
                contributions *= weights[pairs[picked], None]
                sums[at[picked]] += contributions
            if transpose:
                transposed(sums, out[:, share])

    cores.split(some_latents, d_sae, item_size=max(1, len(ids) * products[0][1].shape[1] // d_sae))
    return outs


def pair_passes(at):  # int [p], sorted -> [int [q]]: the pairs in passes, every latent's first pair, then its second,
    # ..., each in blocks of PASS_PAIRS at most: np.add.at would add them all at once, but several times slower
    first = np.flatnonzero(np.r_[True, at[1:] != at[:-1]])  # where each latent's pairs start
    rank = np.arange(len(at)) - np.repeat(first, np.diff(np.r_[first, len(at)]))  # a pair's place among its latent's
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[by_rank], np.arange(rank.max(initial=-1) + 2))
    return [by_rank[block:min(block + PASS_PAIRS, stop)] for start, stop in zip(bounds, bounds[1:])
            for block in range(start, stop, PASS_PAIRS)]


def transposed(a, out):  # [l, d] -> out [d, l]: a's transpose, copied TILE rows at a time (NumPy's copy of a.T runs
    # down a's columns, a cache miss an element at [24,576, 768]; tiles are about 2x faster, measured)
    for start in range(0, len(a), TILE):
        out[:, start:start + TILE] = a[start:start + TILE].T
    return out


def piece_rows(d_sae, k, d_in):  # -> rows per piece of the forward pass: ROWS, or fewer where a piece's largest
    # arrays ([rows, d_sae] pre-activations, [rows, k, d_in] decoder rows) would pass HEAP_ARRAYS_UP_TO, so that glibc
    # reuses them from piece to piece (keep_freed_memory) instead of mapping fresh pages, each a fault (the gather of
    # the decoder rows took 3x as long at 768 -> 24,576 latents, k 32, measured)
    return max(1, min(ROWS, HEAP_ARRAYS_UP_TO // (4 * max(d_sae, k * d_in))))


def topk_loss_and_grads(x, params, k, dead=None, apply_b_dec_to_input=True, target=None, batch_threshold=False):
    # -> (losses, grads, stats), as sae.loss_and_grads(..., "topk"); with batch_threshold, stats also "threshold":
    # the pre-activation that the batch's n k largest reach (BatchTopK's), where a JumpReLU keeps k a row on average
    # the forward pass in pieces of piece_rows() rows, the backward over the batch's (row, latent) pairs (latent_sums),
    # each shared among the cores (cores.split). Run within cores.all_cores(): OpenBLAS on one thread, as its own
    # threads spend more time handing over products this small than multiplying
    (n, d_in), d_sae = x.shape, params["W_enc"].shape[1]
    y = x if target is None else target
    rows_each = piece_rows(d_sae, k, d_in)
    starts = range(0, n, rows_each)
    pieces = [None] * len(starts)

    def some_pieces(share):
        for at in range(len(starts))[share]:
            span = slice(starts[at], starts[at] + rows_each)
            pieces[at] = rows_forward(x[span], y[span], params, k, dead, n, apply_b_dec_to_input,
                                      n * k if batch_threshold else 0)

    cores.split(some_pieces, len(starts), item_size=rows_each * params["W_enc"].size)
    batch = {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}
    ids, rows = batch["latents"].ravel(), np.repeat(np.arange(n), k)  # the (row, latent) pairs, latents.ravel()'s order
    enc_weights, dec_weights = batch["d_values"].ravel(), batch["values"].ravel()
    enc_vectors, dec_vectors = batch["x_in"], batch["d_x_hat"]
    losses = {"mse": float(np.mean(batch["squared_error"]))}
    if "aux_latents" in batch:  # the AuxK pairs, as rows n to 2n: W_dec's from the AuxK error, W_enc's from x_in again
        # (a row may pick a latent among its k and its AuxK ones both: as a row of its own, no pair repeats)
        ids = np.concatenate([ids, batch["aux_latents"].ravel()])
        rows = np.concatenate([rows, n + np.repeat(np.arange(n), batch["aux_latents"].shape[1])])
        enc_weights = np.concatenate([enc_weights, batch["d_aux_values"].ravel()])
        dec_weights = np.concatenate([dec_weights, batch["aux_values"].ravel()])
        enc_vectors = np.concatenate([enc_vectors, enc_vectors])
        dec_vectors = np.concatenate([dec_vectors, batch["d_aux_error"]])
        losses["aux"] = float(np.mean(batch["aux_squared_error"]))
    # d_W_enc = (d_preᵀ x_in)ᵀ and d_W_dec = fᵀ d_x̂, with d_pre's and f's nonzeros at the pairs
    d_W_enc, d_W_dec = latent_sums(ids, rows, [(enc_weights, enc_vectors, True), (dec_weights, dec_vectors, False)],
                                   d_sae)
    d_b_enc = np.bincount(ids, weights=enc_weights, minlength=d_sae).astype(np.float32)  # d_pre.sum(axis=0)
    grads = {"W_enc": d_W_enc, "b_enc": d_b_enc, "W_dec": d_W_dec, "b_dec": batch["d_x_hat"].sum(axis=0)}
    if apply_b_dec_to_input:  # x_in = x - b_dec
        grads["b_dec"] -= d_b_enc @ params["W_enc"].T
    if "W_skip" in params:  # x̂ += x W_skipᵀ
        grads["W_skip"] = batch["d_x_hat"].T @ x
    active = batch["values"] > 0
    stats = {"explained_variance": float(1 - np.sum(batch["squared_error"]) / np.sum((y - y.mean(axis=0)) ** 2)),
             "l0": float(np.mean(active.sum(axis=-1))),
             "fired": np.bincount(batch["latents"][active], minlength=d_sae) > 0}
    if batch_threshold:
        stats["threshold"] = max(float(np.partition(batch["top_pre"], -n * k)[-n * k]), 0.0)
    return losses, grads, stats
