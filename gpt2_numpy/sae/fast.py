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
from gpt2_numpy.sae.model import AUX_COEFFICIENT, aux_k, has_aux, top_k_indices

GROUP = 8  # latents per group in top_k_grouped
ROWS = 512  # rows per piece of the forward pass, whatever the team, so that each row's numbers are the same on any team
# a latent used by more than 1 / DENSE_SHARE of the rows has its sum taken by a dense product (its column of the
# mostly-zero matrix) rather than pair by pair: a multiply-add in OpenBLAS costs about 1 / DENSE_SHARE of a gathered,
# scaled and scattered element in NumPy's passes (measured on the AVX2 and AVX-512 machines of docs/performance.md)
DENSE_SHARE = 128
TILE = 256  # rows per tile of transposed(): a [TILE, d] tile and its transpose stay in cache


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


def rows_forward(x, params, k, dead, n):  # [m, d_in] -> {name: [m, ...]}: one piece's latents, reconstruction and the
    # gradients at its k latents (and k_aux AuxK latents), of losses averaged over a batch of n rows
    W_enc, b_enc, W_dec, b_dec = params["W_enc"], params["b_enc"], params["W_dec"], params["b_dec"]
    x_in = x - b_dec
    pre = x_in @ W_enc
    pre += b_enc  # in place: [m, d_sae] is the step's largest array
    latents = top_k_grouped(pre, k)  # [m, k]
    values = np.maximum(np.take_along_axis(pre, latents, axis=-1), 0)  # [m, k]: f's nonzero entries, and zeros
    rows = W_dec[latents]  # [m, k, d_in]: the decoder rows each activation uses
    x_hat = (values[:, None, :] @ rows)[:, 0] + b_dec  # Σ over its k latents of f_j W_dec[j]: k rows, not d_sae
    error = x_hat - x
    d_x_hat = error * np.float32(2 / n)
    d_values = (rows @ d_x_hat[:, :, None])[..., 0] * (values > 0)  # [m, k]: d_pre at its k latents (ReLU's mask)
    piece = {"x_in": x_in, "latents": latents, "values": values, "d_values": d_values, "d_x_hat": d_x_hat,
             "squared_error": np.sum(error**2, axis=-1)}
    if has_aux(x.shape[-1], dead):  # the AuxK loss, from each row's k_aux dead latents in the same way
        dead_ids = np.flatnonzero(dead)
        k_aux, scale = aux_k(x.shape[-1], len(dead_ids))
        dead_pre = pre[:, dead_ids]  # [m, n_dead]: the sort runs on the dead latents alone
        picked = top_k_indices(dead_pre, k_aux)
        aux_latents, aux_values = dead_ids[picked], np.take_along_axis(dead_pre, picked, axis=-1)  # [m, k_aux]
        aux_rows = W_dec[aux_latents]  # [m, k_aux, d_in]
        aux_error = (aux_values[:, None, :] @ aux_rows)[:, 0] + error  # Σ aux_j W_dec[j] - (x - x̂)
        d_aux_error = aux_error * np.float32(AUX_COEFFICIENT * scale * 2 / n)
        piece.update(aux_latents=aux_latents, aux_values=aux_values, d_aux_error=d_aux_error,
                     d_aux_values=(aux_rows @ d_aux_error[:, :, None])[..., 0],
                     aux_squared_error=AUX_COEFFICIENT * scale * np.sum(aux_error**2, axis=-1))
    return piece


def latent_sums(ids, rows, weights, vectors, d_sae, transpose=False):
    """int [p], int [p], [p], [m, d] -> [d_sae, d] ([d, d_sae] if transpose): row j the sum over the pairs at latent j
    of weights[p] vectors[rows[p]], which the textbook writes as the product scattered(weights)ᵀ @ vectors, with an
    [m, d_sae] array of p nonzeros. Here the pairs are sorted by latent, and a latent's sum is taken pair by pair (in
    passes: every latent's first pair, then its second, ...), or, for one used by more than m / DENSE_SHARE rows, by a
    product with its column alone. The latents are shared among the cores; each sum runs in row order, on any team."""
    m, d = vectors.shape
    order = np.argsort(ids, kind="stable")  # each latent's pairs together, in row order
    ids, rows, weights = ids[order], rows[order], weights[order]
    bounds = np.searchsorted(ids, np.arange(d_sae + 1))  # latent j's pairs: bounds[j] to bounds[j + 1]
    dense = np.diff(bounds) * DENSE_SHARE > m
    out = np.empty((d, d_sae), vectors.dtype) if transpose else np.zeros((d_sae, d), vectors.dtype)

    def some_latents(share):
        sums = np.zeros((share.stop - share.start, d), vectors.dtype) if transpose else out[share]
        pairs = slice(bounds[share.start], bounds[share.stop])
        at, heavy = ids[pairs] - share.start, dense[share]
        by_column = heavy[at]
        light = ~by_column
        if by_column.any():
            columns = np.flatnonzero(heavy)  # [h]
            weight_columns = np.zeros((m, len(columns)), vectors.dtype)  # [m, h]: the mostly-zero matrix's columns
            # add.at: a row may use a latent twice (once among its k, once among its AuxK picks)
            np.add.at(weight_columns, (rows[pairs][by_column], np.searchsorted(columns, at[by_column])),
                      weights[pairs][by_column])
            sums[columns] = weight_columns.T @ vectors  # [h, m] @ [m, d], transposed first as model.py's d_W_enc
        add_pair_by_pair(sums, at[light], rows[pairs][light], weights[pairs][light], vectors)
        if transpose:
            transposed(sums, out[:, share])

    cores.split(some_latents, d_sae, item_size=max(1, len(ids) * d // d_sae))
    return out


def add_pair_by_pair(sums, at, rows, weights, vectors):  # sums [l, d] += the pairs' weights[p] vectors[rows[p]] at
    # sums[at[p]], at sorted: in passes of one pair per latent (its first, then its second, ...), so that no pass
    # writes a row twice and a fancy-indexed += adds each pair (np.add.at does the same, several times slower)
    first = np.flatnonzero(np.r_[True, at[1:] != at[:-1]])  # where each latent's pairs start
    rank = np.arange(len(at)) - np.repeat(first, np.diff(np.r_[first, len(at)]))  # a pair's place among its latent's
    by_rank = np.argsort(rank, kind="stable")
    passes = np.searchsorted(rank[by_rank], np.arange(rank.max(initial=-1) + 2))
    for start, stop in zip(passes, passes[1:]):
        picked = by_rank[start:stop]
        contributions = vectors[rows[picked]]
        contributions *= weights[picked, None]
        sums[at[picked]] += contributions


def transposed(a, out):  # [l, d] -> out [d, l]: a's transpose, copied TILE rows at a time (NumPy's copy of a.T runs
    # down a's columns, a cache miss an element at [24,576, 768]; tiles are about 3x faster)
    for start in range(0, len(a), TILE):
        out[:, start:start + TILE] = a[start:start + TILE].T
    return out


def topk_loss_and_grads(x, params, k, dead=None):  # -> (losses, grads, stats), as sae.loss_and_grads(..., "topk")
    # the forward pass in pieces of ROWS rows, the backward over the batch's (row, latent) pairs (latent_sums), each
    # shared among the cores (cores.split). Run within cores.all_cores(): OpenBLAS on one thread, as its own threads
    # spend more time handing over products this small than multiplying
    n, d_sae = len(x), params["W_enc"].shape[1]
    starts = range(0, n, ROWS)
    pieces = [None] * len(starts)

    def some_pieces(share):
        for at in range(len(starts))[share]:
            pieces[at] = rows_forward(x[starts[at]: starts[at] + ROWS], params, k, dead, n)

    cores.split(some_pieces, len(starts), item_size=ROWS * params["W_enc"].size)
    batch = {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}
    row_of = np.repeat(np.arange(n), k)  # the row of each (row, latent) pair, latents.ravel()'s order
    ids, enc_weights, dec_weights = batch["latents"].ravel(), batch["d_values"].ravel(), batch["values"].ravel()
    dec_rows, dec_vectors = row_of, batch["d_x_hat"]
    losses = {"mse": float(np.mean(batch["squared_error"]))}
    if "aux_latents" in batch:  # the AuxK pairs: W_dec's from the AuxK error, W_enc's from x_in as the others
        aux_row_of = np.repeat(np.arange(n), batch["aux_latents"].shape[1])
        ids = np.concatenate([ids, batch["aux_latents"].ravel()])
        enc_weights = np.concatenate([enc_weights, batch["d_aux_values"].ravel()])
        dec_weights = np.concatenate([dec_weights, batch["aux_values"].ravel()])
        dec_rows = np.concatenate([row_of, n + aux_row_of])
        dec_vectors = np.concatenate([dec_vectors, batch["d_aux_error"]])
        row_of = np.concatenate([row_of, aux_row_of])
        losses["aux"] = float(np.mean(batch["aux_squared_error"]))
    # d_W_dec = fᵀ d_x̂ and d_W_enc = (d_preᵀ x_in)ᵀ, with f and d_pre's nonzeros at the pairs
    d_b_enc = np.bincount(ids, weights=enc_weights, minlength=d_sae).astype(np.float32)  # d_pre.sum(axis=0)
    grads = {"W_enc": latent_sums(ids, row_of, enc_weights, batch["x_in"], d_sae, transpose=True), "b_enc": d_b_enc,
             "W_dec": latent_sums(ids, dec_rows, dec_weights, dec_vectors, d_sae),
             "b_dec": batch["d_x_hat"].sum(axis=0) - d_b_enc @ params["W_enc"].T}
    active = batch["values"] > 0
    stats = {"explained_variance": float(1 - np.sum(batch["squared_error"]) / np.sum((x - x.mean(axis=0)) ** 2)),
             "l0": float(np.mean(active.sum(axis=-1))),
             "fired": np.bincount(batch["latents"][active], minlength=d_sae) > 0}
    return losses, grads, stats
