"""Text in, text out: GPT-2 loaded by size or from a folder, a prompt continued (whole, or streamed piece by piece)
and a text scored, all on plain strings. No flags and no printing: the command lines do the same with argv and stdout.

    from gpt2_numpy import complete, load_model, score_text, stream
    model = load_model("124M")  # or a model folder, e.g. one that gpt2_numpy.train wrote
    print(complete(model, "Alan Turing theorized that", n_tokens=20))
    for piece in stream(model, "The cat", temperature=0.8, seed=1):
        print(piece, end="", flush=True)
    print(score_text(model, "Hello world!")["perplexity"])
"""
from gpt2_numpy.decode import iter_generate
from gpt2_numpy.likelihood import scored_bytes, summary, text_ids, token_log_probs
from gpt2_numpy.loading import Model, load_model, prompt_ids

__all__ = ["Model", "load_model", "complete", "stream", "score_text"]


def complete(model, prompt, n_tokens=40, **options):  # -> str: the continuation only, without the prompt
    """stream's pieces joined: the text the model adds to prompt. Takes stream's options."""
    return "".join(stream(model, prompt, n_tokens, **options))


def stream(model, prompt, n_tokens=40, *, temperature=0.0, top_k=None, top_p=None, seed=None, stop_at_eos=True):
    """Continue prompt with up to n_tokens new tokens, yielding the text as it comes: pieces of whole characters (a
    character split over several tokens comes once all its bytes have). Greedy when temperature is 0 (the default),
    else sampled with top_k / top_p and numpy.random.default_rng(seed); it stops at <|endoftext|> unless stop_at_eos
    is False. "<|endoftext|>" typed in the prompt is the end-of-text token, and an empty prompt starts from it. The
    arguments are checked here, before the first piece: UsageError for a prompt that does not fit, or bad options."""
    ids = prompt_ids(model.tokenizer, prompt, model.hparams["n_vocab"])
    new_ids = iter_generate(ids, model.params, model.hparams["n_head"], n_tokens, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed, stop_at_eos=stop_at_eos,
                            eos_id=model.tokenizer.eot_id)
    return model.tokenizer.stream_decoder().pieces(new_ids)


def score_text(model, text, *, bos=True, stride=None):  # -> {n_tokens, nll, perplexity, bits_per_byte, n_bytes}
    """How likely the model finds text (see score.summary): nll in nats per token, perplexity, and bits per UTF-8
    byte. With bos, <|endoftext|> goes before the text so that its first token is scored too; stride sets the windows
    of a text longer than the context (score.token_log_probs). UsageError for an empty text."""
    ids = text_ids(model.tokenizer, text, model.hparams["n_vocab"], bos)
    log_probs = token_log_probs(ids, model.params, model.hparams["n_head"], stride=stride)
    return summary(log_probs, scored_bytes(model.tokenizer, ids))
