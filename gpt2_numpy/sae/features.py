"""Look at an SAE's latents (model.py) on a model: which fire where, what each writes to the logits, and what
the model does with one taken out or pushed in.

    f = latent_activations(ids, params, n_head, sae)        # [n_seq, d_sae]: the SAE's latents at its hook
    top_ids, top_values = strongest_latents(f, 5)          # each position's 5 strongest latents
    promoted, suppressed = logit_effects(sae, params, [F], 10)  # W_dec[F] read by the unembedding

Edits, for run_with_edits (edits.py), at the SAE's hook; both as SAELens's and ARENA's 1.3 tutorials make them:
    ablate  x ← x − Σ_F f_F(x) W_dec[F]   the latents' share of x taken out, everything else in x kept: SAELens's
                                            latent ablation with the error term (use_error_term=True), so that the
                                            change is the latents' alone and not the SAE's reconstruction error too
    steer   x ← x + SCALE · W_dec[F]        at every position, ARENA's steering by a latent's decoder row

A latent's direct effect on the logits is its decoder row as the unembedding reads it: W_dec[F] centred and scaled
by ln_f's gain, @ wteᵀ (TransformerLens's W_U with ln_f folded in and the writing weights centred, which ARENA's
`W_dec[F] @ W_U` uses). ln_f's division by the stream's norm is a positive number per position, so it changes no
ranking and is left out; ln_f's bias adds the same to every latent's. A hook that is not in the residual stream's
space is first carried there by its block's output projection (attn.z by attn's c_proj, mlp.hidden by mlp's); others
(q, k, v, the attention scores) have no direct effect.

scan() reads a text window by window: each latent's strongest contexts and a histogram of its non-zero activations,
which the feature page (page.py) draws.
"""
import numpy as np

from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.ablation import prediction
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.names import RESIDUAL_STEPS, layer_of, step_of
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.sae.activations import at_hook, model_rows
from gpt2_numpy.sae.model import decoder_norms
from gpt2_numpy.sae.processing import output_scale

STRONGEST = 5  # latents shown per position by explain --sae
FLOAT32_MAX = float(np.finfo(np.float32).max)  # a steered row beyond it is infinite in the model's float32
HISTOGRAM_BINS = 20
CONTEXT_BEFORE, CONTEXT_AFTER = 12, 4  # tokens around a top activation that a context shows


# --- The latents at the SAE's hook ---


def latent_activations(ids, params, n_head, sae):  # int [n_seq] -> [n_seq, d_sae]: the SAE's latents at its hook
    return sae.encode(model_rows(ids, params, n_head, sae.hook))


def strongest_latents(f, top):  # [n_seq, d_sae] -> (ids int [n_seq, top], activations [n_seq, top]), strongest first
    # ties keep the lower id first; a latent at 0 did not fire, and the caller shows only activations above 0
    order = np.argsort(-f, axis=-1, kind="stable")[:, :top]
    return order, np.take_along_axis(f, order, axis=-1)


def explain_latents(sae, ids, params, n_head, ablate=(), steers=()):  # -> explain --sae's result: {"sae", "top"}, or
    # {"sae", "ablate", "steers", "effect"} with latents to take out or steers [(latent, scale)] (latent_edit_effect's)
    if not (ablate or steers):
        return {"sae": sae, "top": strongest_latents(latent_activations(ids, params, n_head, sae), STRONGEST)}
    return {"sae": sae, "ablate": ablate, "steers": steers,
            "effect": latent_edit_effect(ids, params, n_head, sae, ablate, steers)}


# --- Edits ---


def check_latents(latents, d_sae, flag="latent"):  # -> None; ValueError for an id that is not a latent of the SAE
    for latent in latents:
        if isinstance(latent, bool) or not isinstance(latent, (int, np.integer)) or not 0 <= latent < d_sae:
            raise ValueError(f"{flag} {latent!r} is out of range: this SAE has {d_sae} latents, numbered 0 to "
                             f"{d_sae - 1}")


def checked_latents(latents, sae, flag):  # -> latents; UsageError naming the flag for one that is no latent of sae,
    # or is given twice
    twice = next((latent for number, latent in enumerate(latents) if latent in latents[:number]), None)
    if twice is not None:  # more likely a typo for another latent: taking one out twice would subtract it twice
        raise UsageError(f"{flag} names latent {twice} more than once: give each latent once")
    try:
        check_latents(latents, sae.d_sae, flag)
    except ValueError as error:
        raise UsageError(f"{error}: give latent ids below {sae.d_sae}") from None
    return latents


def check_steers(steers, sae):  # -> None; UsageError for a scale that overflows float32 on its decoder row
    for latent, scale in steers:
        norm = float(decoder_norms(sae.params["W_dec"][latent]))
        if not abs(scale) * norm < FLOAT32_MAX:
            raise UsageError(f"--steer {latent}:{scale:g} overflows: the scale times the row's norm {norm:.4g} is "
                             f"beyond float32's largest number ({FLOAT32_MAX:.3g}): give a smaller scale")


def ablated_latents(sae, latents, x):  # [..., d_in] -> [..., d_in]: x less the latents' share, f_F(x) W_dec[F] (times
    # σ for an SAE that layer-normalises its input: its decoder writes in the normalised space)
    latents = list(latents)
    f = sae.encode(x)[..., latents]  # [..., n_latents]
    return x - f @ sae.params["W_dec"][latents] * output_scale(sae, x)


def steered(sae, steers, x):  # [..., d_in] -> [..., d_in]: x + Σ SCALE · W_dec[F], at every position
    return x + sum(scale * sae.params["W_dec"][latent] for latent, scale in steers)


def ablation_edit(sae, latents):  # -> Edit: the latents taken out of the activation at sae.hook
    check_latents(latents, sae.d_sae)
    return Edit(sae.hook, at_hook(lambda x: ablated_latents(sae, latents, x), sae.hook))


def steering_edit(sae, steers):  # [(latent, scale)] -> Edit: their decoder rows, scaled, added at sae.hook
    check_latents([latent for latent, _ in steers], sae.d_sae)
    return Edit(sae.hook, at_hook(lambda x: steered(sae, steers, x), sae.hook))


def edited_logits(ids, params, n_head, edits):  # -> ([n_seq, n_vocab] clean, [n_seq, n_vocab] edited)
    return trace(ids, params, n_head)["logits"], run_with_edits(ids, params, n_head, edits)["logits"]


# --- What a latent writes to the logits ---


def no_direct_effect(hook):  # -> why the logits read nothing an SAE at hook writes directly; None when they do
    if hook == "embed" or step_of(hook) in (*RESIDUAL_STEPS, "attn.z", "mlp.hidden"):
        return None
    return (f"an SAE at {hook} writes nothing the logits read directly: the direct effect is defined for the residual "
            f"stream ({', '.join(RESIDUAL_STEPS)}, embed), attn.z and mlp.hidden")


def residual_direction(sae, params, latents):  # -> [n_latents, n_embd]: the decoder rows, in the residual stream
    rows = sae.params["W_dec"][list(latents)]
    hook = sae.hook
    problem = no_direct_effect(hook)
    if problem:
        raise ValueError(problem)
    if step_of(hook) == "attn.z":
        return rows @ params["blocks"][layer_of(hook)]["attn"]["c_proj"]["w"]
    if step_of(hook) == "mlp.hidden":
        return rows @ params["blocks"][layer_of(hook)]["mlp"]["c_proj"]["w"]
    return rows


def logit_effects(sae, params, latents, top):  # -> (promoted, suppressed): each [n_latents] of [(token id, effect)]
    """Each latent's direct effect on the logits, (W_dec[F] - its mean) · ln_f.g @ wteᵀ (module docstring): the `top`
    tokens it raises most, largest first, and the `top` it lowers most, most negative first."""
    direction = residual_direction(sae, params, latents)
    centred = direction - direction.mean(axis=-1, keepdims=True)  # ln_f subtracts the mean first: a linear step
    effects = (centred * params["ln_f"]["g"]) @ params["wte"].T  # [n_latents, n_vocab]
    order = np.argsort(-effects, axis=-1, kind="stable")
    return ([[(int(t), float(row[t])) for t in ranked[:top]] for row, ranked in zip(effects, order)],
            [[(int(t), float(row[t])) for t in ranked[::-1][:top]] for row, ranked in zip(effects, order)])


# --- Over a text: each latent's strongest contexts and its histogram ---


def scan(windows, params, n_head, sae, latents, n_contexts=10, bins=HISTOGRAM_BINS, progress=None):
    """Token ids [n_windows, n_seq] run window by window; for each latent of `latents`:
        contexts   its n_contexts strongest activations: [(activation, window, position)], strongest first
        histogram  (counts [bins], edges [bins + 1]) of its activations above 0, over [0, its largest]
        fired      how many positions it fired at (above 0), of `positions`
    Returns {"latents": {latent: {...}}, "positions": int, "activations": [n_windows, n_seq, n_latents]}; the
    activations are kept so that a context can be shaded token by token. progress(items, total) wraps the windows."""
    latents = list(latents)
    windows = np.atleast_2d(np.asarray(windows))
    rows = windows if progress is None else progress(windows, len(windows))
    acts = np.stack([latent_activations(w, params, n_head, sae)[:, latents] for w in rows])  # [n_windows, n_seq, n]
    found = {}
    flat = acts.reshape(-1, len(latents))
    for column, latent in enumerate(latents):
        values = flat[:, column]
        strongest = np.argsort(-values, kind="stable")[:n_contexts]
        strongest = strongest[values[strongest] > 0]
        fired = values[values > 0]
        counts, edges = np.histogram(fired, bins=bins, range=(0.0, float(fired.max()) if len(fired) else 1.0))
        found[latent] = {"contexts": [(float(values[i]), *map(int, divmod(int(i), windows.shape[1])))
                                      for i in strongest],
                         "histogram": (counts, edges), "fired": int(len(fired))}
    return {"latents": found, "positions": int(flat.shape[0]), "activations": acts}


def context_span(position, n_seq):  # -> (start, stop): the tokens a context shows around position
    return max(0, position - CONTEXT_BEFORE), min(n_seq, position + CONTEXT_AFTER + 1)


def busiest_latents(windows, params, n_head, sae, count):  # -> the `count` latents that fire most often, most first
    """Latents ordered by how many positions of windows [n_windows, n_seq] they fire at (ties: the lower id);
    latents that never fire are left out."""
    fired = sum((latent_activations(w, params, n_head, sae) > 0).sum(axis=0) for w in np.atleast_2d(windows))
    order = np.argsort(-fired, kind="stable")
    return [int(latent) for latent in order[:count] if fired[latent] > 0]



def latent_edit_effect(ids, params, n_head, sae, ablate=(), steers=()):  # -> {"before": prediction, "after": ...}
    """The loss and the next tokens on token ids `ids` (ablation.prediction's), as the model runs and with the
    latents `ablate` taken out and `steers` [(latent, scale)] added at sae.hook. ValueError for a latent out of range;
    NonFiniteError when the model computes NaN or infinity."""
    edits = [ablation_edit(sae, ablate)] * bool(ablate) + [steering_edit(sae, steers)] * bool(steers)
    before, after = edited_logits(ids, params, n_head, edits)
    return {"before": prediction(before, ids), "after": prediction(after, ids)}
