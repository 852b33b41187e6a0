"""The benchmark's bounds (scripts/bench/roofline.py) and the decode goal that reads them (scripts/bench/goals.py), at
made-up rates: what each kind of row must read and multiply, from GPT-2 124M's published size and the count of its
products, not from our own output. And the work scripts/dev/bounds.py times for the training step's floor."""
import pytest

from scripts.bench import goals, roofline
from scripts.bench.harness import HF, OURS

N_PARAMS_124M, N_WPE = 124_439_808, 1024 * 768  # GPT-2 small's weights, wte counted once; its position embeddings
N_EMBD, N_LAYER, N_VOCAB = 768, 12, 50257
UNLIMITED = 1e30  # a rate that bounds nothing


def test_a_decode_rows_bound_is_every_weight_and_the_kv_cache_read_once_a_token():
    rates = roofline.Rates(read=1e9, gemm=UNLIMITED)
    # 128 steps after a 16-token prompt: the step at position p reads every weight but wpe and the p + 1 cached keys
    # and values of each layer
    step_bytes = [4 * (N_PARAMS_124M - N_WPE) + 4 * 2 * N_LAYER * N_EMBD * (p + 1) for p in range(16, 16 + 128)]
    expected = 128 / (sum(step_bytes) / 1e9)
    assert roofline.bound("decode with KV cache, 16-token prompt + 128 (tok/s)", rates) == pytest.approx(expected,
                                                                                                         rel=1e-9)


def test_a_prefill_rows_bound_is_its_flops_at_the_sgemm_rate():
    rates = roofline.Rates(read=UNLIMITED, gemm=1e12)
    n = 1024
    linear = 2 * n * N_LAYER * 12 * N_EMBD**2  # four weights of 3, 1, 4 and 4 n_embd² floats a layer
    attention = 2 * 2 * N_EMBD * N_LAYER * n * (n + 1) // 2  # q kᵀ and the weighted sum over the causal pairs
    lm_head = 2 * n * N_EMBD * N_VOCAB
    expected = (linear + attention + lm_head) / 1e12
    assert roofline.bound("prefill 1024 tokens, all positions (s)", rates) == pytest.approx(expected, rel=1e-9)
    last = roofline.bound("prefill 1024 tokens, last-position logits (s)", rates)
    # to the last logits only, the last block runs its c_attn on every position and the rest on one
    skipped = (2 * (n - 1) * 9 * N_EMBD**2 + 2 * 2 * N_EMBD * (n * (n + 1) // 2 - n) + 2 * (n - 1) * N_EMBD * N_VOCAB)
    assert last == pytest.approx(expected - skipped / 1e12, rel=1e-9)


def test_rows_without_a_known_run_have_no_bound():
    rates = roofline.Rates(1e9, 1e12)
    for metric in ["peak RSS of a train step, 124M shape, 4 x 256 tokens (MB, fresh process)",
                   "textbook model.gpt2: prefill 1024 tokens, all positions (s)", "load 124M, HF safetensors (s)"]:
        assert roofline.bound(metric, rates) is None


@pytest.mark.parametrize("ours, limit, met", [(60, 65, True), (60, 70, False), (80, 200, True)])
def test_decode_meets_its_goal_at_90_percent_of_its_bound_below_1_5_times_hf(ours, limit, met):
    rows = [{"metric": goals.DECODE + "-token prompt + 128 (tok/s)", "better": "higher", OURS: ours, HF: 50,
             "bound": limit}]  # 60 / 65 = 92% of the bound; 60 / 70 = 86%; 80 is 1.6× HF's 50
    found = next(v for v in goals.verdicts(rows, count=1) if v["goal"].startswith("decode 16 + 128 ≥ 1.5×"))
    assert found["met"] is met
    assert found["share"] == pytest.approx(ours / limit)


def test_the_training_floors_adamw_moves_every_weight_of_the_models_params_wpe_included():
    from gpt2_numpy.params import flatten, random_params
    from scripts.dev import bounds

    n_weights = sum(leaf.size for _, leaf in flatten(random_params(bounds.TRAINING_HPARAMS, seed=0)))
    assert bounds.training_weights() == n_weights


def test_the_training_floors_blocks_run_each_threads_share_of_the_sequences_through_every_linear_layer(monkeypatch):
    # as fast_backward.by_sequences shares a step: 8 sequences of 128 on 2 threads are 512 rows each, on 3 (which
    # does not divide 8) all 1,024 on one
    import numpy as np

    from gpt2_numpy import fast_backward
    from scripts.dev import bounds

    calls = []
    monkeypatch.setattr(fast_backward, "linear_forward", lambda x, w, b: calls.append(("forward", x.shape, w.shape)))
    monkeypatch.setattr(fast_backward, "linear_backward",
                        lambda d, x, w: calls.append(("backward", x.shape, w.shape)))
    n_embd, n_layer = bounds.TRAINING_HPARAMS["n_embd"], bounds.TRAINING_HPARAMS["n_layer"]
    weights = [(n_embd, 3 * n_embd), (n_embd, n_embd), (n_embd, 4 * n_embd), (4 * n_embd, n_embd)] * n_layer
    for count, shares, n_rows in [(2, 2, 512), (3, 1, 1024)]:
        calls.clear()
        bounds.training_blocks_products(np.random.default_rng(0), count)()
        expected = [("forward", (n_rows, n_in), (n_in, n_out)) for n_in, n_out in weights]
        expected += [("backward", (n_rows, n_in), (n_in, n_out)) for n_in, n_out in weights[::-1]]
        assert sorted(calls) == sorted(expected * shares)
