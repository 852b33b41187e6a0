"""The decode loop: the prompt once, then one token per step with the KV cache, for one sequence or a batch of
them. The command line that prints continuations is gpt2_numpy/commands/generate.py.

    ids = generate(tokenizer.encode("Alan Turing theorized that"), params, hparams["n_head"], 40)
"""
import functools
import numbers

import numpy as np

from gpt2_numpy.console import plural
from gpt2_numpy.errors import OutOfMemory, UsageError
from gpt2_numpy.checks import check_finite, check_inputs
from gpt2_numpy.fast import gpt2_cached, new_cache
from gpt2_numpy.sampling import check_sampling_args, next_token

BATCH_SIZE = 8  # rows per pass by default: a step of 8 rows costs a few times one row's, so 8 rows pay best


def generate(inputs, params, n_head, n_tokens_to_generate, **options):  # -> list of new ids
    """All of iter_generate's ids as one list: the continuation only, without the prompt or <|endoftext|>."""
    return list(iter_generate(inputs, params, n_head, n_tokens_to_generate, **options))


def iter_generate(
    inputs, params, n_head, n_tokens_to_generate, *, temperature=0.0, top_k=None, top_p=None, seed=None,
    stop_at_eos=True, eos_id=None,
):  # -> iterator of new ids, for streaming
    """Yields up to n_tokens_to_generate new ids, one per step. Greedy when temperature is 0 (the default);
    otherwise sampled (see sampling.py) with numpy.random.default_rng(seed). With stop_at_eos, generation ends at
    <|endoftext|> (eos_id, by default the model's last id: see stop_id), which is not yielded. The arguments are
    checked here, before the first id is asked for: ValueError for bad token ids, UsageError for everything else."""
    inputs = check_prompt(inputs, n_tokens_to_generate, params)
    check_sampling_args(temperature, top_k, top_p, seed)
    choose = sampler(temperature, top_k, top_p, seed)
    return decode_loop(inputs, params, n_head, n_tokens_to_generate, choose, stop_id(params, stop_at_eos, eos_id))


def stop_id(params, stop_at_eos, eos_id):  # -> the id that ends a continuation, or None
    # <|endoftext|> is the last id of GPT-2's vocabulary (50256) and of every vocabulary that train --vocab-size and
    # the tokenizer command make; a model of another layout passes its own eos_id (its tokenizer's eot_id)
    if not stop_at_eos:
        return None
    return len(params["wte"]) - 1 if eos_id is None else eos_id


def decode_loop(inputs, params, n_head, n_tokens, choose, stop_id):  # -> iterator of new ids
    cache = cache_for(params, n_head, n_slots=len(inputs) + n_tokens - 1)  # the last id chosen is never fed back
    new_ids = inputs  # the whole prompt on the first step, then only the token just chosen
    for _ in range(n_tokens):
        logits, cache = gpt2_cached(new_ids, cache, **params, n_head=n_head, last_only=True)  # [1, n_vocab]
        check_finite(logits)
        next_id = choose(logits[0])
        if next_id == stop_id:
            return
        yield next_id
        new_ids = [next_id]


def generate_batch(
    prompts, params, n_head, n_tokens_to_generate, *, temperature=0.0, top_k=None, top_p=None, seed=None,
    stop_at_eos=True, eos_id=None,
):  # -> list of new-id lists, one per prompt
    """Continue every prompt (token-id lists of any lengths) in one batch; each row gets exactly the ids `generate`
    would give it alone, with seed + i for row i (each row has its own numpy.random.default_rng). A row that reaches
    <|endoftext|> stops there (with stop_at_eos) while the others go on."""
    rows = iter_batch(prompts, params, n_head, n_tokens_to_generate, temperature=temperature, top_k=top_k, top_p=top_p,
                      seed=seed, stop_at_eos=stop_at_eos, eos_id=eos_id)  # the arguments checked first
    continuations = [None] * len(prompts)
    for row, ids in rows:
        continuations[row] = ids
    return continuations


def iter_batch(
    prompts, params, n_head, n_tokens_to_generate, *, temperature=0.0, top_k=None, top_p=None, seed=None,
    stop_at_eos=True, eos_id=None,
):  # -> iterator of (row, new ids), as each row finishes
    """generate_batch, yielding each row's continuation as soon as it is complete. Arguments are checked up front:
    ValueError for bad token ids, UsageError (naming the prompt by index) for everything else."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__") or len(prompts) == 0:
        raise UsageError(f"prompts must be a non-empty list of token-id lists, got {type(prompts).__name__}")
    prompts = [check_prompt(ids, n_tokens_to_generate, params, f"prompt {row}") for row, ids in enumerate(prompts)]
    check_sampling_args(temperature, top_k, top_p, seed)
    choosers = [sampler(temperature, top_k, top_p, None if seed is None else seed + row) for row in range(len(prompts))]
    return batch_decode_loop(prompts, params, n_head, n_tokens_to_generate, choosers,
                             stop_id(params, stop_at_eos, eos_id))


def batch_decode_loop(prompts, params, n_head, n_tokens, choosers, stop_id):  # -> iterator of (row, new ids)
    width = max(len(prompt) for prompt in prompts)
    pad = np.array([width - len(prompt) for prompt in prompts])
    step_ids = np.array([[0] * n_pad + list(prompt) for n_pad, prompt in zip(pad, prompts)])  # [n_rows, width]
    # slots for the prompt and every chosen token but the last, which is never fed back
    cache = cache_for(params, n_head, n_slots=width + n_tokens - 1, pad=pad)
    rows = np.arange(len(prompts))  # the original index of each row still running
    new_ids = [[] for _ in prompts]
    for step in range(n_tokens):
        logits, cache = gpt2_cached(step_ids, cache, **params, n_head=n_head, last_only=True)  # [n_running, 1, n_vocab]
        check_finite(logits)
        # each row draws from its own generator, as it would alone (the model step above is one call for all rows)
        chosen = [choosers[row](row_logits[0]) for row, row_logits in zip(rows, logits)]
        running = []
        for i, (row, next_id) in enumerate(zip(rows, chosen)):
            if next_id != stop_id:
                new_ids[row].append(next_id)
            if next_id == stop_id or step == n_tokens - 1:
                yield int(row), new_ids[row]
            else:
                running.append(i)
        if len(running) < len(rows) and running:  # finished rows leave the batch and stop costing compute
            cache, rows = cache.keep(running), rows[running]
        step_ids = np.array(chosen)[running, None]  # [n_running, 1]
        if not running:
            return


def cache_for(params, n_head, n_slots, pad=None):  # -> new_cache's KVCache; OutOfMemory naming what to lower
    try:
        return new_cache(params["wpe"], params["blocks"], n_head, pad=pad, n_slots=n_slots)
    except MemoryError:
        n_layer, n_embd = len(params["blocks"]), params["wpe"].shape[1]
        n_rows = 1 if pad is None else len(pad)
        n_bytes = 2 * n_layer * n_rows * n_slots * n_embd * 4  # keys and values, float32
        fixes = ["compute fewer rows at once (--batch-size)"] if n_rows > 1 else []
        raise OutOfMemory(
            f"the KV cache of {plural(n_rows, 'row')} x {n_slots} positions needs {n_bytes / 2**30:.1f} GiB, more than "
            f"this machine could allocate: {' or '.join([*fixes, 'generate fewer tokens (--n-tokens)'])}") from None


def sampler(temperature, top_k, top_p, seed):  # -> function choosing an id from logits [n_vocab], with its own rng
    return functools.partial(
        next_token, rng=np.random.default_rng(seed), temperature=temperature, top_k=top_k, top_p=top_p
    )


def check_prompt(inputs, n_tokens, params, name="the prompt"):  # -> int64 [n_prompt]; ValueError or UsageError
    n_ctx, n_vocab = params["wpe"].shape[0], params["wte"].shape[0]
    ids = np.asarray(inputs)
    if ids.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {ids.shape}")
    check_room(len(ids), n_tokens, n_ctx, name)  # first: an overlong prompt gets the message that says how to fix it
    try:
        return check_inputs(ids, n_vocab, n_ctx)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def check_room(n_prompt, n_tokens, n_ctx, name="the prompt"):  # -> None, or UsageError when it overflows n_ctx
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Integral) or n_tokens < 1:
        raise UsageError(f"the number of tokens to generate must be a whole number >= 1, got {n_tokens!r}")
    if n_prompt + n_tokens > n_ctx:
        fixes = [f"shorten {name} to at most {plural(n_ctx - n_tokens, 'token')}"] if n_tokens < n_ctx else []
        if n_prompt < n_ctx:
            fixes.append(f"generate at most {plural(n_ctx - n_prompt, 'token')}")
        raise UsageError(
            f"{name}'s {plural(n_prompt, 'token')} plus {plural(n_tokens, 'new token')} make {n_prompt + n_tokens}, "
            f"more than the model's context of {n_ctx} tokens: {' or '.join(fixes)}"
        )
