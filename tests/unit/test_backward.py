"""The textbook backward.py: each formula against float64 finite differences of model.py's function (no reference
needed), and against the tuned form that training runs (fast_backward.py, itself checked against torch autograd)."""
import numpy as np
import pytest

from gpt2_numpy import backward, fast, fast_backward, model

RNG = np.random.default_rng(0)


def normal(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


def check_finite_differences(forward, inputs, grads, d_out):
    # the directional derivative of Σ d_out ⊙ forward(...) along a random direction of each input, by central
    # differences in float64, must be that input's gradient dotted with the direction
    for i, grad in grads.items():
        direction = normal(*np.shape(inputs[i]))

        def moved(t, i=i, direction=direction):
            return np.sum(d_out * forward(*inputs[:i], inputs[i] + t * direction, *inputs[i + 1 :]))

        numeric = (moved(1e-6) - moved(-1e-6)) / 2e-6
        assert np.sum(grad * direction) == pytest.approx(numeric, rel=1e-6, abs=1e-8), f"input {i}"


def test_linear_backward_is_the_derivative_of_linear():
    x, w, b, d_out = normal(2, 3, 4), normal(4, 5), normal(5), normal(2, 3, 5)
    d_x, grads = backward.linear_backward(d_out, x, w)
    check_finite_differences(model.linear, [x, w, b], {0: d_x, 1: grads["w"], 2: grads["b"]}, d_out)


def test_gelu_backward_is_the_derivative_of_gelu():
    x, d_out = normal(3, 7) * 3, normal(3, 7)
    check_finite_differences(model.gelu, [x], {0: backward.gelu_backward(d_out, x)}, d_out)


def test_layer_norm_backward_is_the_derivative_of_layer_norm():
    x, g, b, d_out = normal(2, 3, 6), normal(6), normal(6), normal(2, 3, 6)
    d_x, grads = backward.layer_norm_backward(d_out, x, g)
    check_finite_differences(model.layer_norm, [x, g, b], {0: d_x, 1: grads["g"], 2: grads["b"]}, d_out)


def test_softmax_backward_is_the_derivative_of_softmax():
    x, d_out = normal(3, 5), normal(3, 5)
    check_finite_differences(model.softmax, [x], {0: backward.softmax_backward(d_out, model.softmax(x))}, d_out)


def test_attention_backward_is_the_derivative_of_attention():
    q, k, v, d_out = normal(2, 3, 4, 5), normal(2, 3, 4, 5), normal(2, 3, 4, 5), normal(2, 3, 4, 5)
    mask = model.causal_mask(4)
    d_q, d_k, d_v = backward.attention_backward(d_out, q, k, v, mask)
    check_finite_differences(lambda q, k, v: model.attention(q, k, v, mask), [q, k, v], {0: d_q, 1: d_k, 2: d_v},
                             d_out)


def test_lm_head_and_embedding_backward_are_their_derivatives():
    x, wte, wpe, d_logits = normal(2, 3, 4), normal(7, 4), normal(5, 4), normal(2, 3, 7)
    d_x, d_wte = backward.lm_head_backward(d_logits, x, wte)
    check_finite_differences(lambda x, wte: x @ wte.T, [x, wte], {0: d_x, 1: d_wte}, d_logits)
    inputs = np.array([[1, 6, 1], [0, 1, 2]])  # a repeated id: its gradients add up
    d_wte, d_wpe = backward.embedding_backward(d_x, inputs, n_vocab=7, n_ctx=5)
    check_finite_differences(lambda wte, wpe: wte[inputs] + wpe[np.arange(3)], [wte, wpe], {0: d_wte, 1: d_wpe}, d_x)


def test_cross_entropy_is_the_mean_minus_log_probability_and_its_derivative():
    logits, targets = normal(2, 3, 7), np.array([[1, 6, 1], [0, 3, 2]])
    loss, d_logits = backward.cross_entropy(logits, targets)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    assert loss == pytest.approx(-np.mean(np.take_along_axis(log_probs, targets[..., None], axis=-1)), rel=1e-12)

    def mean_loss(logits):
        return backward.cross_entropy(logits, targets)[0]

    check_finite_differences(mean_loss, [logits], {0: d_logits}, 1.0)


def close(tuned, plain):  # float32, equal up to rounding (relative to the largest gradient), in tuples and dicts alike
    if isinstance(plain, (tuple, dict)):
        assert type(tuned) is type(plain) and len(tuned) == len(plain)
        for key in plain.keys() if isinstance(plain, dict) else range(len(plain)):
            close(tuned[key], plain[key])
    elif isinstance(plain, float):
        assert tuned == pytest.approx(plain, rel=1e-6)
    else:
        assert tuned.shape == plain.shape and tuned.dtype == np.float32
        np.testing.assert_allclose(tuned, plain, rtol=0, atol=2e-5 * np.abs(plain).max())


@pytest.mark.parametrize("chunk", [fast.CHUNK, 5])  # 5: GELU's elements and the loss's rows in many pieces
def test_the_tuned_forms_training_runs_equal_the_formulas(chunk, monkeypatch):
    monkeypatch.setattr(fast, "CHUNK", chunk)
    f32 = np.float32
    x, w, d_out = normal(2, 3, 4, dtype=f32), normal(4, 5, dtype=f32), normal(2, 3, 5, dtype=f32)
    close(fast_backward.linear_backward(d_out, x, w), backward.linear_backward(d_out, x, w))

    x, d_out = normal(3, 70, dtype=f32) * 3, normal(3, 70, dtype=f32)
    x[0, :3] = 0  # GELU's tuned backward takes s = y/x, with x = 0 a case of its own
    close(fast_backward.gelu_backward_kept(d_out, x, fast.gelu(x)), backward.gelu_backward(d_out, x))

    x, g, b, d_out = normal(2, 3, 6, dtype=f32), normal(6, dtype=f32), normal(6, dtype=f32), normal(2, 3, 6, dtype=f32)
    kept = fast_backward.layer_norm_forward(x, g, b)[1]
    close(fast_backward.layer_norm_backward_kept(d_out, kept, g), backward.layer_norm_backward(d_out, x, g))

    y, d_out = model.softmax(normal(3, 5, dtype=f32)), normal(3, 5, dtype=f32)
    close(fast_backward.softmax_backward_in_place(d_out.copy(), y), backward.softmax_backward(d_out, y))

    q, k, v, d_out = (normal(2, 3, 7, 5, dtype=f32) for _ in range(4))
    for query_block in (64, 3):  # the queries in one block, and in three (the last of one query)
        monkeypatch.setattr(fast_backward, "QUERY_BLOCK", query_block)
        weights = fast_backward.attention_forward(q, k, v, model.causal_mask(7))[1]
        close(fast_backward.attention_backward_kept(d_out, q, k, v, weights),
              backward.attention_backward(d_out, q, k, v, model.causal_mask(7)))

    # the head's gradient from the loss's, which cross_entropy_in_place leaves as a [..., n_vocab] array and a
    # scale a row, and lm_head_backward_scaled applies to the products' smaller sides
    x, wte, logits = normal(2, 3, 4, dtype=f32), normal(7, 4, dtype=f32), normal(2, 3, 7, dtype=f32) * 3
    targets = np.array([[1, 6, 1], [0, 3, 2]])
    loss, d_logits = backward.cross_entropy(logits, targets)
    scaled = logits.copy()
    tuned_loss, row_scales = fast_backward.cross_entropy_in_place(scaled, targets)
    assert row_scales.shape == targets.shape and tuned_loss == pytest.approx(loss, rel=1e-6)
    close(scaled * row_scales[..., None], d_logits)
    close(fast_backward.lm_head_backward_scaled(scaled, row_scales, x, wte),
          backward.lm_head_backward(d_logits, x, wte))
    inputs, d_x = np.array([[1, 6, 1], [0, 1, 2]]), normal(2, 3, 4, dtype=f32)
    close(fast_backward.embedding_backward_into(d_x, inputs, np.zeros((7, 4), f32), 5),
          backward.embedding_backward(d_x, inputs, 7, 5))


@pytest.mark.parametrize("query_block", [64, 2])  # one block of queries, and three (the last of one query)
@pytest.mark.parametrize("offset", [0, 200, -200])  # scores within ±fast.UNSHIFTED, and beyond (as the logits below)
def test_training_attention_takes_its_softmax_without_overflow_or_underflow(offset, query_block, monkeypatch):
    monkeypatch.setattr(fast, "UNSHIFTED_FROM", 1)  # the check at any size
    monkeypatch.setattr(fast_backward, "QUERY_BLOCK", query_block)
    q, k, v = (normal(2, 3, 5, 8) for _ in range(3))
    q[..., 0], k[..., 0] = 1, offset * np.sqrt(8)  # every score q kᵀ / √8 moves by offset
    mask = model.causal_mask(5)
    out, weights = fast_backward.attention_forward(*(a.astype(np.float32) for a in (q, k, v)), mask)
    np.testing.assert_allclose(weights, model.softmax(model.attention_scores(q, k) + mask), atol=1e-5)
    np.testing.assert_allclose(out, model.attention(q, k, v, mask), atol=1e-4)


@pytest.mark.parametrize("guess", [False, True])  # given the head, e^x is taken before the check, and undone by it
@pytest.mark.parametrize("offset", [0, 200, -200])  # logits within ±fast.UNSHIFTED (e^x taken as it is), and beyond:
# e^200 overflows float32, and e^-200 vanishes (0 / 0)
def test_tuned_cross_entropy_takes_its_exp_without_overflow_or_underflow(offset, guess, monkeypatch):
    monkeypatch.setattr(fast, "UNSHIFTED_FROM", 1)  # the check at any size
    monkeypatch.setattr(fast_backward, "CE_CHUNKS", 1)  # with CHUNK 9, a chunk a row: a failed guess remakes one row
    monkeypatch.setattr(fast, "CHUNK", 9)
    # logits = x wteᵀ, x's last column 1 and wte's offset: every logit moves by offset, but for the first row's
    x, wte, targets = normal(4, 5), normal(9, 5), np.array([0, 8, 3, 3])
    x[:, -1], x[0, -1], wte[:, -1] = 1, 0, offset
    x, wte = x.astype(np.float32), wte.astype(np.float32)
    logits = x @ wte.T
    loss, d_logits = backward.cross_entropy(logits.astype(np.float64), targets)  # shifted by each row's max
    guesses, exp_fits = [], fast_backward.exp_fits
    monkeypatch.setattr(fast_backward, "exp_fits", lambda *args: guesses.append(exp_fits(*args)) or guesses[-1])
    scaled = logits.copy()
    tuned_loss, row_scales = fast_backward.cross_entropy_in_place(scaled, targets, (x, wte) if guess else None)
    assert tuned_loss == pytest.approx(loss, abs=1e-4)  # float32 logits near ±200 hold 5 digits after the point
    np.testing.assert_allclose(scaled * row_scales[..., None], d_logits, atol=1e-6)
    # the first row that fails the guess, the second, is made again, and the rows after it are checked first
    assert guesses == ([] if not guess else [True] * 4 if offset == 0 else [True, False])

