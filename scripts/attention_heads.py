"""Score every attention head of a model on a prompt for the patterns that have names, to find heads worth drawing.

    python scripts/attention_heads.py MODEL_DIR "PROMPT"

For each layer and head, with w[i, j] the weight query i gives key j (each row sums to 1), averaged over the queries
i >= 1 (query 0 can only attend to itself):
    previous   w[i, i-1]: a previous-token head copies what came just before
    first      w[i, 0]: the first position, a common resting place for a head with nothing to do
    self       w[i, i]
    punct      the sum of w[i, j] over the keys j that are punctuation tokens (",", ".", "?", ...)
A head with nothing learned spreads each row evenly: its scores are the "uniform" line. The last line printed is the
layer and head whose score is the most times its uniform value, for scripts to read; the line before names it.
"""
import sys

import numpy as np

from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.explain import attention_weights
from gpt2_numpy.tokenizer import load_tokenizer


def head_scores(weights, punct):  # [..., n_seq, n_seq], bool [n_seq] -> {pattern: [...]}, means over queries >= 1
    queries = np.arange(1, weights.shape[-1])
    return {"previous": weights[..., queries, queries - 1].mean(-1), "first": weights[..., queries, 0].mean(-1),
            "self": weights[..., queries, queries].mean(-1), "punct": weights[..., queries, :][..., punct].sum(-1)
            .mean(-1)}


def uniform_weights(n_seq):  # -> [n_seq, n_seq]: every query spreads its weight evenly over the keys it may see
    return np.tril(np.ones((n_seq, n_seq))) / np.arange(1, n_seq + 1)[:, None]


def main(model_dir, prompt):
    hparams, params = load_params(model_dir)
    tokenizer = load_tokenizer(model_dir)
    ids = tokenizer.encode(prompt)
    punct = np.array([not any(char.isalnum() for char in tokenizer.decode([token_id])) for token_id in ids])
    scores = head_scores(attention_weights(ids, params, hparams["n_head"]), punct)
    uniform = head_scores(uniform_weights(len(ids)), punct)
    print(f"{len(ids)} tokens, {punct.sum()} of them punctuation")
    print("layer head " + "".join(f"{name:>9}" for name in scores))
    print("  uniform  " + "".join(f"{value:9.3f}" for value in uniform.values()))
    for layer, head in np.ndindex(*scores["previous"].shape):
        print(f"{layer:5} {head:4} " + "".join(f"{scores[name][layer, head]:9.3f}" for name in scores))
    ratios = {name: scores[name] / uniform[name] for name in scores}
    name = max(ratios, key=lambda pattern: ratios[pattern].max())
    layer, head = np.unravel_index(ratios[name].argmax(), ratios[name].shape)
    print(f"most pronounced: layer {layer} head {head}, {name} {ratios[name][layer, head]:.1f}x uniform")
    print(layer, head)


if __name__ == "__main__":
    main(*sys.argv[1:])
