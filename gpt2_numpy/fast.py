"""The tuned GPT-2 forward pass: model.py's math, with the tricks that make it fast. Float32 throughout, no I/O.

model.py is the textbook; this file computes the same logits (tests/unit/test_fast.py holds the two equal) with a
KV cache for decoding, batches of ragged prompts, query blocks, last_only, in-place passes, a chunked GELU and every
core for long passes. Each trick's comment names the textbook line it replaces and why it is faster. generate, score
and the package's gpt2 run this pass. Params are nested dicts named like OpenAI's checkpoint (see README), splatted
into the functions with **.
"""
import math
import time
from dataclasses import dataclass

import numpy as np

from gpt2_numpy import cores
from gpt2_numpy.checks import check_heads, check_inputs
from gpt2_numpy.model import merge_heads

# Python floats, not NumPy's: NumPy 2 would promote float32 * np.float64 to float64
GELU_SCALE = math.sqrt(2 / math.pi)
MINUS_2U = (-2 * GELU_SCALE, -2 * GELU_SCALE * 0.044715)  # -2 sqrt(2/pi) (x + 0.044715 x^3) = x (a + b x^2)
CHUNK = 1 << 17  # elements per pass of in_chunks: a chunk and its output (1 MB) stay in cache, and each NumPy call
# runs long enough that threads sharing a pass seldom queue for the GIL between calls (the shares measured, at this
# size and a quarter of it: docs/making-it-fast.md)
ALL = slice(None)  # every position
UNSHIFTED = 50.0  # softmax's e^x without subtracting each row's max where every max lies within ±this
UNSHIFTED_FROM = 1 << 15  # ... and there are at least this many of them (exp_in_place())
ONES = {}  # dtype -> a read-only vector of ones, as long as the longest row_sums() has summed (ones())
QUERY_BLOCK = 128  # queries per block of causal attention: a block's scores stay in L3 cache, and it skips the future
EINSUM_PATH = ["einsum_path", (0, 1)]  # contract operand 0 with operand 1: the only order two operands have
PLAIN_EINSUM_MACS = 1 << 18  # up to this many multiply-adds, einsum's own loop beats its matmul route (einsum())
ROWS_EACH = 256  # rows per thread from which a linear layer's product is shared by rows (linear()): a 1,024-token
# prefill on 2 threads took 0.956x, 0.995x, 0.983x and 0.980x the time by columns here (in turns, four runs), 0.968x
# with OpenBLAS's Haswell kernels
FEW_ROWS = 32  # 2 to FEW_ROWS rows (a batch's decode step) multiply a weight piece by piece (few_rows_product())
FEW_ROWS_PIECE = 32  # outputs per piece of few_rows_product() on a column-major weight: 768 x 32 floats, 96 KB
ROW_MAJOR_PIECE = 64  # ... on a row-major weight: 64 contiguous floats (256 bytes) of each of its rows
FEW_ROWS_LEAD = 4  # pieces that the thread splitting a few rows' product takes beyond an even share (few_rows_product)
FORM_TRIALS = 12  # a batch step's products of each kind timed this many times in each form before one is chosen: the
# first two steps of a 12-layer model, beyond the spin of OpenBLAS's workers from the prompt's pass (in_faster_form)
# OpenBLAS's AVX-512 kernels, with which a batch's few-row products run fastest on column-major weights
COLUMN_MAJOR_KERNELS = {"SkylakeX", "Cooperlake", "SapphireRapids"}  # inference_layout
FORMS = {}  # (n_rows, w's shape, order and dtype, threads) -> the form that ran it faster here, or the timings so far
ALL_CORES_FROM = 512  # positions from which a pass shares its heads, columns and rows among the cores (cores.py):
# shorter passes gain nothing, as OpenBLAS's workers, still spinning from a product before, cost more than it saves


def gelu(x):  # [...] -> [...]
    # GPT-2's tanh approximation of x Phi(x): 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3), computed as
    # x / (1 + e^(-2u)), since 0.5 (1 + tanh u) = 1 / (1 + e^(-2u)) and exp costs half of tanh here
    with np.errstate(over="ignore"):  # e^(-2u) = inf for x below about -10 gives x / inf = -0, the true limit
        return in_chunks(gelu_chunk, x)


def gelu_chunk(x, out):  # [n] -> out [n]: gelu's passes, in place on out
    np.divide(x, gelu_denominator(x, out=out), out=out)


def gelu_denominator(x, out):  # [n] -> out [n]: 1 + e^(-2u), so that gelu(x) = x / it
    a, b = MINUS_2U
    np.multiply(x, x, out=out)
    out *= b
    out += a
    out *= x  # -2u = x (a + b x^2)
    np.exp(out, out=out)
    out += 1
    return out


def in_chunks(passes, *arrays):  # passes(*chunks, out=chunk of the result) over pieces of equal-shaped arrays -> result
    # an elementwise formula of several passes, run a chunk at a time: each pass over a chunk and its output runs in
    # L2 cache, where one pass over the whole array after another would stream it from memory each time
    out = np.empty(arrays[0].shape, np.result_type(*arrays))  # C-ordered, so that out.reshape(-1) is a view
    flats, flat_out = [np.asarray(array).reshape(-1) for array in arrays], out.reshape(-1)

    def run(share):  # within cores.all_cores() the elements are shared among the cores, as NumPy runs a pass on one
        for start in range(share.start, share.stop, CHUNK):
            part = slice(start, min(start + CHUNK, share.stop))
            passes(*(flat[part] for flat in flats), out=flat_out[part])

    cores.split(run, flat_out.size, item_size=1)
    return out


def chunks(n_items, item_size=1):  # -> slices over n_items, each of about CHUNK elements (at least one item)
    step = max(1, CHUNK // item_size)
    return [slice(start, start + step) for start in range(0, n_items, step)]


def softmax(x, out=None):  # [..., n] -> [..., n], in out when given (x itself may be out)
    exp_x = shifted_exp(x, out=out)
    exp_x /= exp_x.sum(axis=-1, keepdims=True)
    return exp_x


def shifted_exp(x, out=None):  # [..., n] -> [..., n]: e^(x - max x), softmax before its division
    # softmax(x) = softmax(x - c) for any c, and c = max x keeps e^(x - c) <= 1, so it cannot overflow
    out = np.subtract(x, x.max(axis=-1, keepdims=True), out=out)  # the method: np.max's Python wrapper costs more
    return np.exp(out, out=out)


def layer_norm(x, g, b, eps=1e-5):  # [..., n_seq, n_embd] -> [..., n_seq, n_embd]
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty(rows.shape, x.dtype)

    def some_rows(piece):  # within cores.all_cores() the rows are shared among the cores, as NumPy runs a pass on one
        normalize(rows[piece], g, b, eps, out=out[piece])

    cores.split(some_rows, len(rows), item_size=rows.shape[-1])
    return out.reshape(x.shape)


def normalize(x, g, b, eps, out):  # [n_rows, n_embd] -> out [n_rows, n_embd]: layer_norm of each row
    n = x.shape[-1]
    # x - mean, the row sums as dot products with ones: BLAS's dot runs about 3 times faster than NumPy's pairwise
    # sum along rows (and no np.mean Python wrapper)
    centered = np.subtract(x, row_sums(x)[..., None] / n, out=out)
    variance = np.vecdot(centered, centered)[..., None] / n  # mean of squares as one dot product per row: no temporary
    # g (x - mean) / sqrt(variance + eps) + b, in place on out; times 1 / sqrt(...) divides once per row
    centered *= 1 / np.sqrt(variance + eps)
    centered *= g
    centered += b


def row_sums(x):  # [..., n] -> [...]: x.sum(axis=-1), as a dot product of each row with ones
    # (row by row, not one product x @ ones: a matrix-vector product's rounding depends on how many rows it is given,
    # and a row's must not depend on how the rows are shared among threads)
    return np.vecdot(x, ones(x.shape[-1], x.dtype))


def ones(n, dtype):  # -> [n] ones of dtype, read-only: made once for every length up to the longest asked for, as
    # making them at each call would cost more than the sum they speed up in a decode step
    made = ONES.get(dtype)
    if made is None or len(made) < n:
        made = ONES[dtype] = np.ones(max(n, 1024), dtype)
        made.flags.writeable = False
    return made[:n]


def linear(x, w, b):  # [..., n_in] -> [..., n_out]
    # one product for all leading axes: matmul on a [n_rows, n_seq, n_in] stack would run one product per row, each
    # streaming all of w, and a batch decode step would cost as much as n_rows single ones
    rows = x.reshape(-1, x.shape[-1])
    if batch_step(x):  # 2 to FEW_ROWS rows in a pass of their own; the bias added in the pass that makes the result
        # C-ordered
        out = np.empty((len(rows), w.shape[-1]), np.result_type(rows, w, b))
        return np.add(in_faster_form(rows, w), b, out=out).reshape(*x.shape[:-1], w.shape[-1])
    if by_dot_products(rows, w):
        return np.add(dot_products(rows, w), b).reshape(*x.shape[:-1], w.shape[-1])
    # x w + b, the bias added in place: no second [n_seq, n_out] array. Within cores.all_cores(), OpenBLAS runs one
    # thread and the team shares the product: by rows where each thread has ROWS_EACH of them or more (each reads all
    # of w, from the cache the cores share, and writes whole rows of the result), else by output columns (each reads
    # its part of w and all of the smaller x)
    over = cores.ROWS if len(rows) >= ROWS_EACH * cores.team_size() else cores.COLUMNS
    return cores.matmul(rows, w, bias=b, over=over).reshape(*x.shape[:-1], w.shape[-1])


def inference_layout(params):  # -> params of the same values, block weights laid out for decoding on these kernels
    # A decode step multiplies one row (a batch step a few) by every weight, and which order of a weight runs that
    # fastest depends on OpenBLAS's kernels (bounds.py --few-rows; docs/making-it-fast.md). mlp.c_proj.w [4*n_embd,
    # n_embd], the one weight taller than wide, is stored column-major on any (the same [n_in, n_out] array, wᵀ's rows
    # in memory: each output one dot product over contiguous floats), and one row's product of it runs faster so. With
    # AVX-512 kernels (COLUMN_MAJOR_KERNELS) the other three are too: a batch's few-row products then run in pieces of
    # wᵀ's rows 16% faster, and one row's as fast (on one thread as dot products, dot_products()); with AVX2 kernels
    # a batch's products of a row-major weight run faster whole. Prefill's many-row products run as fast in either
    # order, and every function here, in model.py and in training takes either order: only the speed differs
    return {**params, "blocks": [block_layout(block) for block in params["blocks"]]}


def block_layout(block):  # -> one block's params as inference_layout lays them out
    every = cores.openblas_core() in COLUMN_MAJOR_KERNELS

    def laid_out(layer, column_major):
        return {**layer, "w": np.asfortranarray(layer["w"])} if column_major else layer

    return {**block, **{part: {name: laid_out(layer, every or (part, name) == ("mlp", "c_proj"))
                               for name, layer in block[part].items()} for part in ("attn", "mlp")}}


def ffn(x, c_fc, c_proj):  # [..., n_seq, n_embd] -> [..., n_seq, n_embd]
    return linear(gelu(linear(x, **c_fc)), **c_proj)  # [..., n_seq, 4*n_embd] in between


def offset_causal_mask(n_q, n_k):  # -> [n_q, n_k]
    # model.causal_mask for queries after cached keys: query i is position n_k - n_q + i (earlier positions may come
    # from the KV cache); it must not see later keys
    return np.triu(np.full((n_q, n_k), -np.inf, dtype=np.float32), k=n_k - n_q + 1)


def attention_scores(q, k):  # [..., n_head, n_q, d_head], [..., n_head, n_k, d_head] -> [..., n_head, n_q, n_k]
    # model.attention_scores' einsum with q scaled first: q kᵀ / √d_head = (q / √d_head) kᵀ, which divides the
    # [n_q, d_head] queries instead of the [n_q, n_k] scores. k comes first in the einsum, q second, because the
    # matmul route then returns the scores C-ordered (q first gives a transposed view, which every pass below strides)
    return einsum("...kd,...qd->...qk", k, q / math.sqrt(q.shape[-1]), n_macs=q.size * k.shape[-2])


def attention(q, k, v, mask):  # [..., n_head, n_q, d_head], [..., n_head, n_k, d_head] x2, [..., n_q, n_k] -> like q
    scores = attention_scores(q, k)
    scores += mask  # in place here and below: the [..., n_head, n_q, n_k] scores are the largest array
    exp_in_place(scores)  # the scores are e^(s - c) now: the weights before their division
    # model.attention's softmax(scores + mask) v as (e^s v) / Σ e^s: the division runs over [n_q, d_head], not over
    # [n_q, n_k]; v first, for a C-ordered result as above; the sums as dot products with ones, as in normalize()
    out = einsum("...kd,...qk->...qd", v, scores, n_macs=scores.size * v.shape[-1])
    out /= row_sums(scores)[..., None]
    return out


def exp_in_place(x):  # [..., n] -> c, [..., 1] or 0.0; x becomes e^(x - c), c constant along each row
    # softmax(x) = softmax(x - c) for any c. Where every row's max lies within ±UNSHIFTED, c = 0 is as good as the max
    # (shifted_exp): no e^x overflows float32 (whose exp overflows beyond 88), each row's largest term is at least
    # e^-50, and terms it loses to underflow weigh below e^-37 of it; and it saves a pass over x
    # Below UNSHIFTED_FROM elements (a decode step's scores), the check's two reductions cost more than the pass they
    # save
    top = x.max(axis=-1, keepdims=True)
    if x.size >= UNSHIFTED_FROM and -UNSHIFTED < top.min() and top.max() < UNSHIFTED:  # False for NaN, and for
        np.exp(x, out=x)  # -inf (a row of scores with no key)
        return 0.0
    np.exp(np.subtract(x, top, out=x), out=x)
    return top


def einsum(subscripts, a, b, n_macs):  # np.einsum of two operands, in its cheapest measured form
    # einsum's own C loop has no setup but runs many times slower than BLAS on large products; given a path, NumPy
    # reshapes the operands into one batched matmul, after a fixed cost of parsing. Below 2^18 multiply-adds (one
    # decode query against up to about 340 keys, 12 heads of 64) the plain loop is the cheaper: benchmark.py's
    # einsum rows measure both. The path of two operands is always (0, 1): given, einsum skips searching for it
    return np.einsum(subscripts, a, b, optimize=False if n_macs <= PLAIN_EINSUM_MACS else EINSUM_PATH)


def split_qkv(x, n_head):  # [..., n_seq, 3*n_embd] -> [3, ..., n_head, n_seq, d_head]: q, k, v, split into heads
    # one transpose of the [..., n_seq, 3, n_head, d_head] view: cheaper per call than np.moveaxis or swapaxes
    n_batch = x.ndim - 2
    qkv = x.reshape(*x.shape[:-1], 3, n_head, -1)
    return qkv.transpose(n_batch + 1, *range(n_batch), n_batch + 2, n_batch, n_batch + 3)


def causal_attention(q, k, v, mask):  # attention's shapes; the queries are the last n_q of the n_k positions
    if q.shape[-2] == 1 and q.ndim > 3 and cores.team_size() > 1:  # a batch's decode step: its rows shared
        return rows_shared(q, k, v, mask)
    if min(cores.team_size(), q.shape[-2]) == 1:  # one core, or one query (a decode step of one sequence): no
        return query_blocks(q, k, v, mask)  # output array to fill, no copy into it
    # The queries are independent: within cores.all_cores() the team shares them, as the elementwise passes (exp above
    # all) would otherwise run on one core while the others wait. Each thread takes a run of queries of every head, of
    # equal work (the causal triangle's rows get longer). Whole heads would leave 4 of 16 threads idle and half of 8
    # waiting, and would make each call's arrays 12 times smaller: its NumPy calls would take longer per float, and
    # 16 threads would queue for the GIL between them
    out = np.empty_like(q)
    bounds = equal_work_bounds(q.shape[-2], k.shape[-2], min(cores.team_size(), q.shape[-2]))

    def some_queries(piece):  # the queries of parts piece.start ... piece.stop - 1: one run, as parts are consecutive
        queries = slice(bounds[piece.start], bounds[piece.stop])
        if queries.start < queries.stop:  # a part of no queries, where two cuts fall on one row
            out[..., queries, :] = query_blocks(*visible(q, k, v, mask, queries))

    cores.split(some_queries, len(bounds) - 1)
    return out


def rows_shared(q, k, v, mask):  # causal_attention of a batch's decode step: [n_rows, n_head, 1, d_head], its keys
    # and values [n_rows, n_head, n_k, d_head], a mask that broadcasts to [n_rows, n_head, 1, n_k] -> like q
    # One query a row leaves no queries to share, but the rows are independent: within a batch step's pass each
    # thread takes some rows, their cached keys and values read from memory on its own core (a step's 12 layers read
    # 47 MB of them at 80 positions, 8 rows): 0.7 ms less of a 40 ms step here, in turns step by step
    out = np.empty_like(q)
    own_rows = mask.ndim == q.ndim and len(mask) == len(q)  # a padded batch's mask has a row each

    def some_rows(piece):
        out[piece] = attention(q[piece], k[piece], v[piece], mask[piece] if own_rows else mask)

    cores.split(some_rows, len(q), item_size=k[0].size)  # a row's keys: the multiply-adds of its scores
    return out


def equal_work_bounds(n_q, n_k, n_parts):  # -> int [n_parts + 1]: query bounds of parts of equal causal work
    # query i sees n_k - n_q + i + 1 keys: the bounds cut the running sum of those counts into equal shares
    work = np.cumsum(np.arange(n_k - n_q + 1, n_k + 1))
    cuts = np.searchsorted(work, work[-1] * np.arange(1, n_parts) / n_parts)
    return [0, *cuts.tolist(), n_q]


def visible(q, k, v, mask, queries):  # -> the queries in slice queries, with the keys, values and mask they see
    seen = k.shape[-2] - q.shape[-2] + queries.stop  # keys up to the last of these queries
    return q[..., queries, :], k[..., :seen, :], v[..., :seen, :], mask[..., queries, :seen]


def query_blocks(q, k, v, mask):  # causal_attention's shapes
    # block by block of queries, each against only the keys up to its last query: the causal triangle is about half
    # of the [n_q, n_k] scores, and exp, which costs many multiplies, is attention's largest elementwise pass
    n_q = q.shape[-2]
    if n_q <= QUERY_BLOCK:  # one block (every decode step): no output array to fill
        return attention(q, k, v, mask)
    out = np.empty_like(q)
    for start in range(0, n_q, QUERY_BLOCK):
        block = slice(start, min(start + QUERY_BLOCK, n_q))
        out[..., block, :] = attention(*visible(q, k, v, mask, block))
    return out


def mha(x, c_attn, c_proj, n_head, mask, past=None, queries=ALL):  # [..., n_seq, n_embd] -> [..., n_q, n_embd]
    q, k, v = split_qkv(linear(x, **c_attn), n_head)  # [..., n_head, n_seq, d_head] each
    if past is not None:
        k, v = extend_past(past, k, v)  # [..., n_head, n_past+n_seq, d_head]
    q = q[..., queries, :]  # queries of the wanted positions only; every position's key and value stay
    return linear(merge_heads(causal_attention(q, k, v, mask[..., queries, :])), **c_proj)


def block(x, ln_1, attn, ln_2, mlp, n_head, mask, past=None, queries=ALL):  # [..., n_seq, n_embd] -> [..., n_q, n_embd]
    # queries: the last positions whose output is wanted, e.g. slice(-1, None); every position gives keys and values
    x = x[..., queries, :] + mha(layer_norm(x, **ln_1), **attn, n_head=n_head, mask=mask, past=past, queries=queries)
    return x + ffn(layer_norm(x, **ln_2), **mlp)  # pre-norm residual branches


def embed(inputs, wte, wpe, n_past=0, pad=None):  # [..., n_seq] -> [..., n_seq, n_embd]
    ids = check_inputs(inputs, n_vocab=wte.shape[0], n_ctx=wpe.shape[0], n_past=n_past)
    if pad is None:
        return wte[ids] + wpe[n_past : n_past + ids.shape[-1]]
    return wte[ids] + wpe[positions(pad, n_past, ids.shape[-1])]


def transformer(inputs, wte, wpe, blocks, ln_f, n_head, cache=None, last_only=False):
    # [..., n_seq] -> [..., n, n_embd]; n = n_seq, or 1 with last_only: then the last block, whose other rows would
    # feed nothing, runs the last row only
    check_heads(n_head, wte.shape[-1])
    n_past, pad = (0, None) if cache is None else (cache.n_past, cache.pad)
    x = embed(inputs, wte, wpe, n_past, pad)
    n_seq = x.shape[-2]
    mask = offset_causal_mask(n_seq, n_past + n_seq)  # built once, shared by every block
    if pad is not None:
        mask = mask + padding_mask(pad, n_past, n_seq)  # [n_rows, 1, n_seq, n_past+n_seq]
    queries = [ALL] * len(blocks)
    if last_only:
        queries[-1] = slice(-1, None)
    with cores.for_model(wte.shape[1]), cores.all_cores(enabled=shares_cores(x)):
        for layer, (block_params, block_queries) in enumerate(zip(blocks, queries)):
            past = None if cache is None else (cache.keys[layer], cache.values[layer], n_past)
            x = block(x, **block_params, n_head=n_head, mask=mask, past=past, queries=block_queries)
    if cache is not None:
        cache.n_past += n_seq
    return layer_norm(x, **ln_f)


def shares_cores(x):  # [..., n_seq, n_embd] -> whether its pass shares its work among the cores (cores.py): a long
    # pass its heads, columns and rows; a batch's decode step the pieces of its few-row products
    return x.size // x.shape[-1] >= ALL_CORES_FROM or batch_step(x)


def batch_step(x):  # [..., n_seq, n_embd] -> whether x is a batch's decode step: 2 to FEW_ROWS rows of one position
    # (a short prompt of one sequence gains nothing from a pass: OpenBLAS's workers, still spinning from a product
    # before, would cost it more than the team saves)
    return x.ndim == 3 and x.shape[1] == 1 and 1 < len(x) <= FEW_ROWS


def lm_head(x, wte):  # [..., n_seq, n_embd] -> [..., n_seq, n_vocab]
    # GPT-2 ties the output projection to the token embeddings: x @ wte.T
    with cores.for_model(wte.shape[1]), cores.all_cores(enabled=batch_step(x)):  # a narrow model's lm head on one
        # thread, as its blocks; a batch step's few rows in pieces shared among the cores
        return vocabulary_product(x.reshape(-1, x.shape[-1]), wte, batch_step(x)).reshape(*x.shape[:-1], len(wte))


def in_faster_form(rows, w):  # [n, n_in] @ [n_in, n_out] -> [n, n_out], in the form that runs it faster here
    # Whether a few rows' product runs faster by pieces (few_rows_product) or whole (cores.matmul: within a pass, by
    # the team's columns) depends on OpenBLAS's kernels and the machine: SkylakeX's kernels run pieces faster, Haswell's
    # the whole (bounds.py --few-rows). So each kind of product is timed where it runs: its first 2 * FORM_TRIALS
    # calls take the two forms in turn, and the one of the faster best trial runs it from then on: a busy core only
    # ever adds to a call's time. For about 0.1 s after the prompt's pass, OpenBLAS's workers still spin on the cores,
    # and a call may wait 3 to 7 ms for one, more than the forms differ: three trials each, by their median, took the
    # slower form for one of the four weights in 5 of 12 fresh processes here. The two differ only in the order of
    # float32 roundings: a batch's logits may differ in their last digits from one process to the next, as they do
    # between thread counts. Only a batch's decode steps choose: one sequence's numbers stay the same
    key = (len(rows), w.shape, w.T.flags.c_contiguous, w.dtype, cores.team_size())
    chosen = FORMS.setdefault(key, {few_rows_product: [], cores.matmul: []})
    if not isinstance(chosen, dict):
        return chosen(rows, w)
    form = min(chosen, key=lambda each: len(chosen[each]))  # the form timed fewer times
    start = time.perf_counter()
    out = form(rows, w)
    chosen[form].append(time.perf_counter() - start)
    if min(map(len, chosen.values())) == FORM_TRIALS:
        FORMS[key] = min(chosen, key=lambda each: min(chosen[each]))
    return out


def vocabulary_product(rows, wte, in_pieces=False):  # [n, n_embd] -> [n, n_vocab]: rows @ wte.T
    if in_pieces:  # a batch's decode step
        return np.ascontiguousarray(few_rows_product(rows, wte.T))  # wte.T: [n_embd, n_vocab], column-major
    if by_dot_products(rows, wte.T):
        return dot_products(rows, wte.T)
    return rows @ wte.T


def by_dot_products(rows, w):  # [n, n_in], [n_in, n_out] -> whether rows @ w runs as dot_products()
    # one row (a decode step), a column-major weight (inference_layout's, the lm head's wte.T), OpenBLAS on one thread:
    # on more, OpenBLAS's own threads run the product faster than a team would share the dot products
    return len(rows) == 1 and w.T.flags.c_contiguous and cores.blas_threads() == 1


def dot_products(rows, w):  # [1, n_in], [n_in, n_out] column-major -> [1, n_out]: rows @ w
    # Each output is the dot product of the row with a contiguous row of wᵀ. OpenBLAS's one-row product (gemv) of
    # this layout streams the weight at about 17 GB/s on one core here, NumPy's vecdot (a dot product per output) at
    # about 26 (bounds.py --few-rows): the same sums, in another order of float32 roundings
    return np.vecdot(w.T, rows)[None]


def few_rows_product(rows, w):  # [n, n_in], [n_in, n_out] -> [n, n_out] (a transposed view if w is column-major)
    # A few rows times a large weight run far from the memory floor, as OpenBLAS packs both operands first and uses
    # each packed float of the weight n times only. By pieces of the weight's outputs, each piece's packed copy is
    # still in cache when it is used; one stacked matmul runs a share of the pieces (a BLAS call each, no Python call
    # each), and within a pass the shares go to the team, OpenBLAS on one thread each: OpenBLAS's own threads on so
    # small a piece would wait for each other more than they multiply. The pieces follow w's order: column-major, as
    # (wᵀ rowsᵀ)ᵀ, wᵀ's rows of contiguous floats, the weight the product's long side; row-major, as rows @ w's
    # columns, each piece a run of contiguous floats of every row (bounds.py --few-rows). The calling thread takes
    # FEW_ROWS_LEAD pieces more than each other thread (cores.split's lead): it starts at once, while each other thread
    # first wakes (here, a virtual machine's idle core, a lock's round trip between two threads took 52 us against 17
    # on one core), and a caller that ends first sleeps until the last piece ends, another wake-up. A batch step's
    # product takes 0.1 to 1 ms, so that wait was a tenth of the step: 4 pieces cut 1.1 to 1.35 ms of a 37 to 42 ms
    # step of 8 rows here (2 and 3 pieces 0.8 to 1.4, 8 none), in turns step by step
    n_in, n_out = w.shape
    dtype = np.result_type(rows, w)
    if w.T.flags.c_contiguous:
        width, out = FEW_ROWS_PIECE, np.empty((n_out, len(rows)), dtype).T

        def product(part):  # the outputs in slice part, a whole number of pieces
            np.matmul(w.T[part].reshape(-1, width, n_in), rows.T, out=out.T[part].reshape(-1, width, len(rows)))
    else:
        width, out = ROW_MAJOR_PIECE, np.empty((len(rows), n_out), dtype)

        def product(part):
            np.matmul(rows, by_pieces(w[:, part], width), out=by_pieces(out[:, part], width))

    n_pieces = n_out // width
    cores.split(lambda pieces: product(slice(pieces.start * width, pieces.stop * width)), n_pieces,
                item_size=width * n_in * len(rows), lead=FEW_ROWS_LEAD)  # a piece's multiply-adds
    tail = slice(n_pieces * width, n_out)  # the last outputs, fewer than a piece
    np.matmul(rows, w[:, tail], out=out[:, tail])
    return out


def by_pieces(a, width):  # [n_rows, k * width] -> [k, n_rows, width]: a's columns, piece by piece (a view)
    return a.reshape(len(a), -1, width).transpose(1, 0, 2)


def gpt2(inputs, wte, wpe, blocks, ln_f, n_head, last_only=False):  # [..., n_seq] -> [..., n, n_vocab]
    """Float32 logits for every position of a token-id sequence [n_seq] (or an equal-length batch [n_rows, n_seq]);
    with last_only=True for the last position only ([..., 1, n_vocab]), all that choosing the next token needs."""
    return lm_head(transformer(inputs, wte, wpe, blocks, ln_f, n_head, last_only=last_only), wte)


def log_softmax_at(logits, targets):  # [n, n_vocab], int [n] -> float64 [n]: ln softmax(logits[i])[targets[i]]
    # log(model.softmax(logits))[targets], in place and float64 where it counts, for scoring and the validation loss
    # Stable: each row is shifted by its max, so exp cannot overflow and the largest term is exactly 1. The shifted
    # logits and their exponentials stay float32: a float64 copy of [n, 50257] would double the memory and the time,
    # and could not add accuracy to float32 logits. The sum over the vocabulary and its log are float64, so adding up
    # 50,257 terms adds no rounding of its own.
    logits -= logits.max(axis=-1, keepdims=True)  # in place: the array is ours, fresh from the model
    picked = logits[np.arange(len(targets)), targets].astype(np.float64)
    return picked - np.log(np.exp(logits, out=logits).sum(axis=-1, dtype=np.float64))


# --- Incremental decoding: the same blocks, with the keys and values of earlier positions kept ---


@dataclass
class KVCache:
    keys: np.ndarray  # [n_layer, (n_rows,) n_head, n_slots, d_head], valid up to n_past
    values: np.ndarray  # the same shape as keys
    n_past: int = 0  # slots filled, the same for every row
    pad: np.ndarray = None  # [n_rows]: a batch's left padding, the slots before each row's first token; None: no batch

    def keep(self, rows):  # -> KVCache of only these rows of a batch, e.g. those still generating
        if self.pad is None:
            raise ValueError("keep() selects rows of a batch cache (new_cache with pad=...); this one holds one "
                             "sequence")
        return KVCache(self.rows_of(self.keys, rows), self.rows_of(self.values, rows), self.n_past, self.pad[rows])

    def rows_of(self, kv, rows):  # [n_layer, n_rows, n_head, n_slots, d_head] -> [n_layer, len(rows), ...]
        out = np.zeros((kv.shape[0], len(rows), *kv.shape[2:]), kv.dtype)  # calloc: untouched slots stay unpaged
        for new, old in enumerate(rows):  # row by row: a fancy index would first copy every kept row to a temporary
            out[:, new, ..., : self.n_past, :] = kv[:, old, ..., : self.n_past, :]
        return out


def new_cache(wpe, blocks, n_head, pad=None, n_slots=None):  # -> KVCache of n_slots (default n_ctx) positions
    """An empty KV cache for gpt2_cached: for one sequence, or, given pad ([n_rows] ints), for a batch whose row i
    starts with pad[i] slots of left padding. n_slots caps the positions it holds (at most n_ctx)."""
    # preallocated once, so each step writes in place instead of concatenating (which copies the cache every token)
    n_ctx, n_embd = wpe.shape
    check_heads(n_head, n_embd)
    if n_slots is not None and not 1 <= n_slots <= n_ctx:
        raise ValueError(f"n_slots={n_slots} must lie in 1 ... n_ctx={n_ctx}")
    rows = () if pad is None else (len(pad),)
    shape = (len(blocks), *rows, n_head, n_ctx if n_slots is None else n_slots, n_embd // n_head)
    pad = None if pad is None else np.asarray(pad, dtype=np.int64)
    if pad is not None and (pad.ndim != 1 or len(pad) == 0 or pad.min() < 0):
        raise ValueError(f"pad must hold one whole number >= 0 per row of the batch, got {pad.tolist()}")
    return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32), pad=pad)


def extend_past(past, k, v):  # [..., n_head, n_seq, d_head] x2 -> [..., n_head, n_past+n_seq, d_head] x2
    k_cache, v_cache, n_past = past
    n_total = n_past + k.shape[-2]
    k_cache[..., n_past:n_total, :], v_cache[..., n_past:n_total, :] = k, v
    return k_cache[..., :n_total, :], v_cache[..., :n_total, :]


# A batch of prompts of different lengths is left-padded to one length, so every row fills the same cache slots and
# a decode step is one array operation for all rows; each row's positions still start at 0 at its own first token,
# and the padding mask hides the padding from it. (Right padding would instead need per-row slots and lengths.)


def positions(pad, n_past, n_seq):  # [n_rows] -> [n_rows, n_seq]: each row's own position at each slot
    return np.maximum(np.arange(n_past, n_past + n_seq) - pad[:, None], 0)  # padding slots reuse position 0


def padding_mask(pad, n_past, n_seq):  # [n_rows] -> [n_rows, 1, n_seq, n_past+n_seq]: -inf where a key is padding
    # hidden from the real queries only: a padding query (whose output no real row uses) sees the padding, so that
    # no row of scores is all -inf, which softmax would turn into NaN and the weighted sum spread to every row (0 * NaN)
    query, key = np.arange(n_past, n_past + n_seq)[:, None], np.arange(n_past + n_seq)
    hidden = (key < pad[:, None, None]) & (query >= pad[:, None, None])  # [n_rows, n_seq, n_past+n_seq]
    return np.where(hidden, np.float32(-np.inf), np.float32(0))[:, None]


def gpt2_cached(inputs, cache, wte, wpe, blocks, ln_f, n_head, last_only=False):  # [..., n_new] -> [..., n, n_vocab]
    """Logits of new token ids after those already in `cache` (from new_cache), which the call extends; returns
    (logits, cache). inputs is [n_new] for one sequence or [n_rows, n_new] for a batch cache; the logits are
    [..., n_new, n_vocab], or [..., 1, n_vocab] for the last position only with last_only=True."""
    ids = check_inputs(inputs, n_vocab=wte.shape[0], n_ctx=wpe.shape[0], n_past=cache.n_past)  # before any change
    rows = cache.keys.shape[1:-3]  # () for one sequence, (n_rows,) for a batch
    if ids.shape[:-1] != rows:  # NumPy would broadcast one sequence's ids to every row of a batch without a word
        kind = f"a batch of {rows[0]} rows, which takes [{rows[0]}, n_new] ids" if rows else "one sequence, [n_new]"
        raise ValueError(f"ids of shape {ids.shape} do not fit a KV cache for {kind}")
    if cache.n_past + ids.shape[-1] > cache.keys.shape[-2]:
        raise ValueError(f"{cache.n_past + ids.shape[-1]} positions exceed the cache's {cache.keys.shape[-2]} slots")
    return lm_head(transformer(ids, wte, wpe, blocks, ln_f, n_head, cache, last_only), wte), cache
