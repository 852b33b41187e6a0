"""The forward pass, one prompt at a time: prefill and decode against HF, what each trick of the tuned pass buys
against the textbook model.py line it replaces, and each piece a long pass shares among threads, three ways (the
"prefill", "decode", "einsum", "tricks" and "threads" parts)."""
import itertools

import numpy as np

from gpt2_numpy import cores
from gpt2_numpy import fast as model
from gpt2_numpy import model as textbook
from scripts.bench.harness import HPARAMS_124M, OURS, TEXTBOOK, in_turns, median_seconds, prompt_ids, row, wall_seconds


def prefill_rows(engines, repeats):
    rows = []
    for n in (128, 1024):
        for last_only, what in ((True, "last-position logits"), (False, "all positions")):
            seconds = in_turns({e.name: wall_seconds(lambda e=e: e.prefill(prompt_ids(n), last_only))
                                for e in engines}, repeats)
            rows.append(row(f"prefill {n} tokens, {what} (s)", "lower", seconds))
    ours = engines[0]  # what the tricks buy: the textbook model.gpt2 on the same prompt and weights
    seconds = median_seconds(lambda: textbook.gpt2(np.array(prompt_ids(1024)), **ours.params, n_head=ours.n_head), 1)
    rows.append(row("textbook model.gpt2: prefill 1024 tokens, all positions (s)", "lower", {OURS: seconds}))
    return rows


def decode_rows(engines, repeats):
    rows = []
    for n_prompt, n_new in ((16, 128), (900, 64)):
        decode = {e.name: lambda e=e: e.decode_seconds(prompt_ids(n_prompt), n_new) for e in engines}
        seconds = in_turns(decode, repeats)
        speed = {name: n_new / s for name, s in seconds.items()}
        rows.append(row(f"decode with KV cache, {n_prompt}-token prompt + {n_new} (tok/s)", "higher", speed))
    n_prompt, n_new = 16, 32
    speed = {e.name: n_new / e.decode_uncached_seconds(prompt_ids(n_prompt), n_new) for e in engines}
    rows.append(row(f"decode without cache, {n_prompt}-token prompt + {n_new} (tok/s)", "higher", speed))
    return rows


def einsum_rows(repeats):  # q kᵀ of 12 heads of 64, three ways: why fast.einsum picks its form by size
    rng = np.random.default_rng(0)
    rows = []
    for n_q, n_k in ((1, 16), (1, 144), (1, 340), (1, 1024), (8, 144), (128, 128), (1024, 1024)):
        q, k = (rng.standard_normal((12, n, 64), dtype=np.float32) for n in (n_q, n_k))
        n_macs = q.size * n_k
        chosen = "plain einsum" if n_macs <= model.PLAIN_EINSUM_MACS else "einsum with the path given"
        path = model.EINSUM_PATH
        for how, run in (("plain einsum", lambda: np.einsum("hkd,hqd->hqk", k, q)),
                         ("einsum with the path given", lambda: np.einsum("hkd,hqd->hqk", k, q, optimize=path)),
                         ("batched matmul (no einsum)", lambda: q @ k.swapaxes(-1, -2))):
            seconds = median_seconds(run, repeats * max(1, 2**20 // n_macs))
            picked = " <- fast.einsum" if how == chosen else ""
            metric = f"q kᵀ [12,{n_q},64] x [12,{n_k},64], 2^{np.log2(n_macs):.1f} MACs, {how}{picked} (us)"
            rows.append(row(metric, "lower", {OURS: seconds * 1e6}))
    return rows


def trick_rows(params, repeats):  # each function of the tuned pass against the model.py line it replaces, 124M shapes
    rng = np.random.default_rng(0)
    block = params["blocks"][0]
    x = rng.standard_normal((1024, 768), dtype=np.float32)
    h = rng.standard_normal((1024, 3072), dtype=np.float32)
    q, k, v = (rng.standard_normal((12, 1024, 64), dtype=np.float32) for _ in range(3))
    step_x = rng.standard_normal((8, 1, 768), dtype=np.float32)  # a batch step: 8 rows of one position
    decode_h = h[-1:]  # a decode step's row into mlp.c_proj
    # each call takes the next layer's weight, as a decode step does: 12 of them (113 MB) stream from memory, where
    # one would stay in cache
    row_major = itertools.cycle([block["mlp"]["c_proj"] for block in params["blocks"]])
    column_major = itertools.cycle([block["mlp"]["c_proj"] for block in model.inference_layout(params)["blocks"]])
    decode_q = q[:, -1:]
    cases = [  # (what, textbook call, tuned call)
        ("gelu of [1024, 3072]", lambda: textbook.gelu(h), lambda: model.gelu(h)),
        ("layer_norm of [1024, 768]", lambda: textbook.layer_norm(x, **block["ln_1"]),
         lambda: model.layer_norm(x, **block["ln_1"])),
        ("linear c_fc of [1024, 768]", lambda: textbook.linear(x, **block["mlp"]["c_fc"]),
         lambda: model.linear(x, **block["mlp"]["c_fc"])),
        ("linear c_fc of a batch step [8, 1, 768]", lambda: textbook.linear(step_x, **block["mlp"]["c_fc"]),
         lambda: model.linear(step_x, **block["mlp"]["c_fc"])),
        ("linear mlp.c_proj of a decode step [1, 3072] (tuned: the weight column-major, fast.inference_layout)",
         lambda: textbook.linear(decode_h, **next(row_major)), lambda: model.linear(decode_h, **next(column_major))),
        ("lm head of a batch step [8, 1, 768]", lambda: step_x @ params["wte"].T,
         lambda: model.lm_head(step_x, params["wte"])),
        ("attention, 12 heads x 1024 positions (fast.attention: no blocks)",
         lambda: textbook.attention(q, k, v, textbook.causal_mask(1024)),
         lambda: model.attention(q, k, v, model.offset_causal_mask(1024, 1024))),
        ("attention, 12 heads x 1024 positions (fast.causal_attention: query blocks)",
         lambda: textbook.attention(q, k, v, textbook.causal_mask(1024)),
         lambda: model.causal_attention(q, k, v, model.offset_causal_mask(1024, 1024))),
        ("attention, 12 heads, one query x 1024 keys (a decode step)",
         lambda: textbook.attention(decode_q, k, v, np.zeros((1, 1024), np.float32)),
         lambda: model.attention(decode_q, k, v, model.offset_causal_mask(1, 1024))),
    ]
    rows = []
    for what, *calls in cases:
        seconds = in_turns({name: wall_seconds(call) for name, call in zip((TEXTBOOK, OURS), calls)}, repeats)
        rows.append(row(f"{what} (ms)", "lower", {name: s * 1e3 for name, s in seconds.items()}))
    return rows + cores_rows(params, repeats)


def cores_rows(params, repeats):  # the tuned pass with its pieces on one core, and on every core (cores.py), in turns
    ids = prompt_ids(1024)

    def prefill():
        model.gpt2(ids, **params, n_head=HPARAMS_124M["n_head"], last_only=True)

    def on_one_core():
        with cores.one_core():
            prefill()

    seconds = in_turns({"one": wall_seconds(on_one_core), "all": wall_seconds(prefill)}, repeats)
    return [row("prefill 1024 tokens, last logits, every split on one thread (cores.one_core()) (s)", "lower",
                {OURS: seconds["one"]}),
            row("prefill 1024 tokens, last logits, splits shared by cores.threads() threads (s)", "lower",
                {OURS: seconds["all"]})]


def piece_rows(params, repeats):  # each piece a long pass splits, three ways, in turns: where threads pay and where not
    rng = np.random.default_rng(0)
    x, h = rng.standard_normal((1024, 768), dtype=np.float32), rng.standard_normal((1024, 3072), dtype=np.float32)
    q, k, v = (rng.standard_normal((12, 1024, 64), dtype=np.float32) for _ in range(3))
    block, mask = params["blocks"][0], model.offset_causal_mask(1024, 1024)
    pieces = {
        "layer_norm of [1024, 768]": lambda: model.layer_norm(x, **block["ln_1"]),
        "linear c_fc of [1024, 768]": lambda: model.linear(x, **block["mlp"]["c_fc"]),
        "gelu of [1024, 3072]": lambda: model.gelu(h),
        "fast.causal_attention of [12, 1024, 64]": lambda: model.causal_attention(q, k, v, mask),
        "every logit of [1024, 768] (x wteᵀ, by the vocabulary's columns)": lambda: cores.matmul(x, params["wte"].T),
    }
    rows = []
    for what, piece in pieces.items():  # the ways' names hold no count, so that --threads lines up their rows
        ways = {"on OpenBLAS's threads, none of ours (outside a pass)": piece,
                "on one thread (OpenBLAS's and ours)": lambda piece=piece: on_one_thread(piece),
                "shared among threads of ours, OpenBLAS on one (cores.all_cores())": lambda piece=piece:
                    in_a_pass(piece)}
        seconds = in_turns({way: wall_seconds(run) for way, run in ways.items()}, repeats)
        rows += [row(f"{what}, {way} (ms)", "lower", {OURS: s * 1e3}) for way, s in seconds.items()]
    return rows


def on_one_thread(piece):  # piece() with OpenBLAS on one thread and no team of ours
    with cores.all_cores(), cores.one_core():
        piece()


def in_a_pass(piece):  # piece() as a long pass runs it
    with cores.all_cores():
        piece()
