"""topk's tuned training step (gpt2_numpy/sae/fast.py) held equal to the textbook's (sae/model.py), on one thread and
on a team, with its latents' sums taken by products and pair by pair; its grouped top-k, and its sparse sums."""
import numpy as np
import pytest

from gpt2_numpy import cores
from gpt2_numpy.sae import fast
from gpt2_numpy.sae.fast import DENSE_SHARE, latent_sums, top_k_grouped, topk_loss_and_grads
from gpt2_numpy.sae.model import loss_and_grads
from tests.sae_helpers import relative_error


@pytest.mark.parametrize("d_sae", [128, 1024])
@pytest.mark.parametrize("with_dead", [False, True])
@pytest.mark.parametrize("tuned", ["rows", "team"])
def test_the_tuned_topk_step_equals_the_textbook(with_dead, tuned, d_sae):
    # "team": the batch in pieces of fast.ROWS (two and a part), shared by two threads. 128 latents: each used by about
    # 1100 * 4 / 128 rows, more than 1100 / DENSE_SHARE, so their sums are products; 1,024: most pair by pair
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1100, 16)).astype(np.float32)
    params = {"W_enc": rng.standard_normal((16, d_sae)).astype(np.float32),
              "b_enc": rng.standard_normal(d_sae).astype(np.float32) - 10,  # some of the k largest are negative
              "W_dec": rng.standard_normal((d_sae, 16)).astype(np.float32),
              "b_dec": rng.standard_normal(16).astype(np.float32)}
    dead = rng.random(d_sae) < 0.3 if with_dead else None
    losses, grads, stats = loss_and_grads(x, params, "topk", k=4, dead=dead)
    if tuned == "rows":
        fast_losses, fast_grads, fast_stats = topk_loss_and_grads(x, params, 4, dead)
    else:
        threads = cores.threads()
        try:
            cores.set_threads(2)
            with cores.all_cores():
                fast_losses, fast_grads, fast_stats = topk_loss_and_grads(x, params, 4, dead)
        finally:
            cores.set_threads(threads)
        assert fast_stats["explained_variance"] == pytest.approx(stats["explained_variance"], rel=1e-5)
    assert fast_losses.keys() == losses.keys()
    for name in losses:
        assert fast_losses[name] == pytest.approx(losses[name], rel=1e-5)
    for name in grads:
        assert relative_error(fast_grads[name], grads[name]) < 1e-5, name
    assert np.array_equal(fast_stats["fired"], stats["fired"])
    assert fast_stats["l0"] == pytest.approx(stats["l0"], rel=1e-6)


@pytest.mark.parametrize("n_rows, n_latents", [(500, 256), (40, 4096)])  # groups' maxima member by member, and as a
# reduction (fast.LONG_ROWS)
def test_the_grouped_top_k_finds_each_rows_k_largest(n_rows, n_latents):
    x = np.random.default_rng(6).standard_normal((n_rows, n_latents)).astype(np.float32)
    expected = np.sort(np.argsort(-x, axis=-1)[:, :5], axis=-1)
    indices, values = top_k_grouped(x, 5)
    assert np.array_equal(np.sort(indices, axis=-1), expected)
    assert np.array_equal(values, np.take_along_axis(x, indices, axis=-1))


@pytest.mark.parametrize("step", ["textbook", "tuned"])
def test_a_topk_sae_of_one_number_has_no_auxk_loss(step):
    # SAELens's k_aux = d_in // 2 dead latents: 0 for d_in 1, so nothing reconstructs the residual (nor divides by 0)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 1)).astype(np.float32)
    params = {"W_enc": rng.standard_normal((1, 8)).astype(np.float32), "b_enc": np.zeros(8, np.float32),
              "W_dec": rng.standard_normal((8, 1)).astype(np.float32), "b_dec": np.zeros(1, np.float32)}
    dead = np.arange(8) >= 4
    if step == "textbook":
        losses, grads, _ = loss_and_grads(x, params, "topk", k=1, dead=dead)
        alive_losses, alive_grads, _ = loss_and_grads(x, params, "topk", k=1)
    else:
        losses, grads, _ = topk_loss_and_grads(x, params, 1, dead)
        alive_losses, alive_grads, _ = topk_loss_and_grads(x, params, 1)
    assert losses == alive_losses and "aux" not in losses
    for name in grads:
        assert np.array_equal(grads[name], alive_grads[name]), name


@pytest.mark.parametrize("transpose", [False, True])
def test_the_latents_sums_equal_the_product_with_the_mostly_zero_matrix(transpose, monkeypatch):
    # latent 0 in every row (its sum a product), 1 to 3 in a third of them each (also products), the rest in one to a
    # few rows each (pair by pair): the textbook's scattered(weights)ᵀ @ vectors, with an [m, d_sae] array. Two
    # threads, each with half the latents however little work that is, and each pass in blocks of 3 pairs
    rng = np.random.default_rng(8)
    m, d, d_sae = 3 * DENSE_SHARE, 5, 600
    latents = np.stack([np.r_[0, 1 + row % 3, rng.choice(np.arange(4, d_sae), 3, replace=False)] for row in range(m)])
    weights = rng.standard_normal(latents.shape).astype(np.float32)
    vectors = rng.standard_normal((m, d)).astype(np.float32)
    mostly_zero = np.zeros((m, d_sae), np.float32)
    np.put_along_axis(mostly_zero, latents, weights, axis=-1)
    rows = np.repeat(np.arange(m), latents.shape[1])
    monkeypatch.setattr(cores, "MIN_WORK", 1)
    monkeypatch.setattr(fast, "PASS_PAIRS", 3)
    threads = cores.threads()
    try:
        cores.set_threads(2)
        with cores.all_cores():
            [sums] = latent_sums(latents.ravel(), rows, [(weights.ravel(), vectors, transpose)], d_sae)
    finally:
        cores.set_threads(threads)
    expected = mostly_zero.T.astype(np.float64) @ vectors
    assert sums.shape == (expected.T if transpose else expected).shape
    assert np.allclose(sums.T if transpose else sums, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tuned", ["rows", "team"])
def test_the_tuned_step_of_a_transcoder_equals_the_textbook(tuned):
    # a transcoder's form: a target apart from the input, no b_dec taken from the input, a skip W_skip; some latents
    # dead, for the AuxK loss against the target's residual
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((1100, 16)).astype(np.float32), rng.standard_normal((1100, 16)).astype(np.float32)
    params = {"W_enc": rng.standard_normal((16, 128)).astype(np.float32),
              "b_enc": rng.standard_normal(128).astype(np.float32),
              "W_dec": rng.standard_normal((128, 16)).astype(np.float32),
              "b_dec": rng.standard_normal(16).astype(np.float32),
              "W_skip": rng.standard_normal((16, 16)).astype(np.float32)}
    dead = rng.random(128) < 0.3
    losses, grads, stats = loss_and_grads(x, params, "topk", k=4, dead=dead, apply_b_dec_to_input=False, target=y)
    if tuned == "rows":
        fast_losses, fast_grads, fast_stats = topk_loss_and_grads(x, params, 4, dead, False, y, batch_threshold=True)
    else:
        threads = cores.threads()
        try:
            cores.set_threads(2)
            with cores.all_cores():
                fast_losses, fast_grads, fast_stats = topk_loss_and_grads(x, params, 4, dead, False, y)
        finally:
            cores.set_threads(threads)
    assert fast_losses.keys() == losses.keys() == {"mse", "aux"}
    for name in losses:
        assert fast_losses[name] == pytest.approx(losses[name], rel=1e-5)
    assert fast_grads.keys() == grads.keys()
    for name in grads:
        assert relative_error(fast_grads[name], grads[name]) < 1e-5, name
    assert fast_stats["explained_variance"] == pytest.approx(stats["explained_variance"], rel=1e-5)
    if tuned == "rows":  # BatchTopK's threshold: exactly n k pre-activations of the batch reach it
        pre = x @ params["W_enc"] + params["b_enc"]
        assert np.sum(pre >= fast_stats["threshold"]) == 1100 * 4
