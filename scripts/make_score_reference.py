"""Build tests/fixtures/reference_score.npz from Hugging Face transformers: what HF says the log-probabilities and
losses of token sequences are, on the seeded random weights of tests/fixtures/configs.json.

- `single_<config>_*` ("tiny", and "124M" for GPT-2's full 50,257-token vocabulary): one window of `inputs`;
  `log_probs` [n - 1] is `log_softmax(HF logits)` (in float64) at the next ids, `loss` is `model(ids, labels=ids).loss`.
- `sliding_*` ("tiny", n_ctx 64, a sequence of 5 * 64 ids): the loop of HF's guide "Perplexity of fixed-length
  models", with windows of n_ctx tokens and `stride` S in STRIDES. For each S, `log_probs_S` [n - 1] holds the
  log-probability HF's logits give each token 1 .. n-1 in the window whose labels score it, `begin_S` [n - 1] that
  window's first position (so the token at t had t - begin_S[t-1] tokens of context), and `nll_S` the mean of HF's
  per-window losses weighted by the tokens each one scored.

Rerun (reference tools live in a venv outside the repo; they are never runtime dependencies):
    ../refvenv/bin/pip install --no-deps -e .
    ../refvenv/bin/python scripts/make_score_reference.py
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# make_reference imports every tool used here (numpy, torch, transformers, gpt2_numpy) and names the first missing one
from make_reference import MISSING, SETUP, hf_model  # noqa: E402

if not MISSING:  # without the tools, --help still works and a run says what to install
    import numpy as np
    import torch
    import transformers

    from gpt2_numpy.params import random_params

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SINGLE_LENGTHS = {"tiny": 64, "124M": 128}  # tiny fills its whole context
SLIDING_CONFIG, SLIDING_WINDOWS = "tiny", 5  # a sequence of 5 contexts
STRIDES = (63, 32, 3)  # W - 1, W / 2 and a small one, for W = 64


def seeded_ids(n, n_vocab, seed):  # -> int64 [n]
    return np.random.default_rng(seed).integers(0, n_vocab, n)


def next_token_log_probs(logits, ids):  # torch [n, n_vocab], int [n + 1] -> float64 [n]: ln p(ids[t + 1] | ...)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    return log_probs[torch.arange(len(logits)), torch.as_tensor(ids[1:])].numpy()


def single_window(model, ids):  # -> {log_probs, loss}: one forward pass over all of ids
    tensor = torch.from_numpy(ids)[None]
    out = model(tensor, labels=tensor)
    return {"log_probs": next_token_log_probs(out.logits[0, :-1], ids), "loss": out.loss.numpy()}


def guide_loop(model, ids, max_length, stride):  # -> {log_probs, begin, nll}: HF's guide's sliding windows
    n = len(ids)
    log_probs, begins = np.full(n, np.nan), np.full(n, -1)
    nll_sum, n_scored, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, n, stride):
        end_loc = min(begin_loc + max_length, n)
        trg_len = end_loc - prev_end_loc  # the tokens no earlier window scored
        input_ids = torch.from_numpy(ids[begin_loc:end_loc])[None]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        out = model(input_ids, labels=target_ids)
        scored = (target_ids[0, 1:] != -100).numpy()  # labels shift by one inside the model: index 0 never scores
        # the guide weights each loss by num_valid_tokens - 1, one token too few for every window after the first
        # (whose first label is already -100); the mean here counts the tokens each loss really averages
        nll_sum += out.loss.item() * scored.sum()
        n_scored += scored.sum()
        positions = begin_loc + 1 + np.flatnonzero(scored)
        assert np.isnan(log_probs[positions]).all(), "a token scored twice"
        log_probs[positions] = next_token_log_probs(out.logits[0, :-1], ids[begin_loc:end_loc])[scored]
        begins[positions] = begin_loc
        prev_end_loc = end_loc
        if end_loc == n:
            break
    assert not np.isnan(log_probs[1:]).any(), "a token left unscored"
    return {"log_probs": log_probs[1:], "begin": begins[1:], "nll": np.array(nll_sum / n_scored)}


def main():
    parser = argparse.ArgumentParser(description="Build tests/fixtures/reference_score.npz from Hugging Face "
                                     "transformers: per-token log-probabilities and losses, in one window and sliding.")
    parser.parse_args()
    if MISSING:
        sys.exit(f"error: {MISSING} is missing from {sys.executable}: {SETUP}")
    torch.manual_seed(0)
    torch.set_grad_enabled(False)  # references only: no autograd graphs
    configs = json.loads((FIXTURES / "configs.json").read_text())
    arrays = {}
    for name, n in SINGLE_LENGTHS.items():
        hparams, seed = configs[name]["hparams"], configs[name]["seed"]
        ids = seeded_ids(n, hparams["n_vocab"], seed + 3000)
        result = single_window(hf_model(hparams, random_params(hparams, seed)), ids)
        arrays.update({f"single_{name}_inputs": ids, **{f"single_{name}_{k}": v for k, v in result.items()}})
        print(f"single {name}: {n} ids, loss {float(result['loss']):.6f}")
    hparams, seed = configs[SLIDING_CONFIG]["hparams"], configs[SLIDING_CONFIG]["seed"]
    model = hf_model(hparams, random_params(hparams, seed))
    ids = seeded_ids(SLIDING_WINDOWS * hparams["n_ctx"], hparams["n_vocab"], seed + 4000)
    arrays["sliding_inputs"] = ids
    for stride in STRIDES:
        result = guide_loop(model, ids, hparams["n_ctx"], stride)
        arrays.update({f"sliding_{k}_{stride}": v for k, v in result.items()})
        print(f"sliding, stride {stride}: {len(set(result['begin']))} windows, mean NLL {float(result['nll']):.6f}")
    arrays["versions"] = np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"])
    np.savez_compressed(FIXTURES / "reference_score.npz", **arrays)
    print(f"wrote {FIXTURES / 'reference_score.npz'} ({(FIXTURES / 'reference_score.npz').stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
