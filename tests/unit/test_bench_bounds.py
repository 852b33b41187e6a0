"""The benchmark's bounds (scripts/bench/roofline.py) and the decode goal that reads them (scripts/bench/goals.py), at
made-up rates: what each kind of row must read and multiply, from GPT-2 124M's published size and the count of its
products, not from our own output."""
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
