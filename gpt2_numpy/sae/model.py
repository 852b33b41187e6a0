"""Sparse autoencoders (SAEs) as the papers and SAELens write them: one small NumPy function per formula, float32.

An SAE reads one activation x [d_in] of the model (a trace name: "blocks.0.out", say) and writes it as a sparse sum of
d_sae directions, its latents:

    f = act((x - b_dec) @ W_enc + b_enc)      encode: W_enc [d_in, d_sae], b_enc [d_sae]; f [d_sae], mostly zeros
    x̂ = f @ W_dec + b_dec                     decode: W_dec [d_sae, d_in], b_dec [d_in]

with act one of SAELens's three architectures: "standard" (ReLU), "topk" (the k largest pre-activations kept, ReLU'd;
Gao et al. 2024, "Scaling and evaluating sparse autoencoders") and "jumprelu" (ReLU, zero at or below a per-latent
threshold). standard and topk are trained here (training.py); a jumprelu SAE loads, encodes and decodes.

Training minimises the mean squared error of x̂, plus
    standard: l1 · Σ_j f_j ‖W_dec[j]‖, the L1 penalty weighted by each decoder row's norm (Anthropic's April 2024
              update, as SAELens has it), so that a latent cannot dodge the penalty by shrinking f and growing its row;
    topk:     the AuxK loss: the k_aux largest pre-activations of the dead latents reconstruct what the live ones
              missed, which gives the dead ones a gradient again.
The gradients are written out below (loss_and_grads), one formula a line, and checked against torch autograd.

A transcoder (sae/transcoder_model.py; Dunefsky et al. 2024) is trained by the same step with a target that is not its
input: x̂ = f @ W_dec + b_dec + x W_skipᵀ reconstructs the MLP's output from the MLP's input, with no b_dec taken
from the input (apply_b_dec_to_input False, as circuit-tracer's encoder has it) and an optional linear skip W_skip
[d_in, d_in] (Paulo et al. 2025).
files.py reads and writes SAELens's folders; SAE below is what they hold; fast.py is topk's step, tuned.
"""
import numpy as np

from gpt2_numpy.sae.transcoder_model import skip

ARCHITECTURES = ("standard", "topk", "jumprelu")
TRAINED = ("standard", "topk")
AUX_COEFFICIENT = 1 / 32  # Gao et al.'s α for the AuxK loss


# --- The forward pass ---


def pre_activations(x, W_enc, b_enc, b_dec, apply_b_dec_to_input=True):  # [..., d_in] -> [..., d_sae]
    return (x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc  # b_dec centres x first, as SAELens does by default


def relu(x):  # [...] -> [...]
    return np.maximum(x, 0)


def top_k_indices(x, k):  # [..., n] -> int [..., k]: where the k largest values of each row are, in no order
    return np.argpartition(x, x.shape[-1] - k, axis=-1)[..., -k:]  # a partial sort: only the k largest are found


def keep_at(x, indices):  # [..., n], int [..., k] -> [..., n]: x at indices, zero elsewhere
    kept = np.zeros_like(x)
    np.put_along_axis(kept, indices, np.take_along_axis(x, indices, axis=-1), axis=-1)
    return kept


def topk(pre, k):  # [..., d_sae] -> [..., d_sae]: the k largest pre-activations, ReLU'd; the rest zero
    return relu(keep_at(pre, top_k_indices(pre, k)))


def jumprelu(pre, threshold):  # [..., d_sae], [d_sae] -> [..., d_sae]
    return relu(pre) * (pre > threshold)  # a latent fires only above its own threshold


def activation(pre, architecture, k=None, threshold=None):  # [..., d_sae] -> [..., d_sae]: f
    if architecture == "topk":
        return topk(pre, k)
    if architecture == "jumprelu":
        return jumprelu(pre, threshold)
    return relu(pre)


def encode(x, W_enc, b_enc, b_dec, architecture, k=None, threshold=None, apply_b_dec_to_input=True, **_):
    # [..., d_in] -> [..., d_sae]; the ** takes the rest of an SAE's params (W_dec), so that params splat in whole
    return activation(pre_activations(x, W_enc, b_enc, b_dec, apply_b_dec_to_input), architecture, k, threshold)


def decode(f, W_dec, b_dec, **_):  # [..., d_sae] -> [..., d_in]
    return f @ W_dec + b_dec


# --- The losses and their gradients ---


def mse(x_hat, x):  # [n, d_in] x2 -> float: the squared error summed over d_in, averaged over the batch (SAELens's)
    return float(np.mean(np.sum((x_hat - x) ** 2, axis=-1)))


def explained_variance(x_hat, x):  # [n, d_in] x2 -> float: 1 - the error's variance over x's, both summed over d_in
    return float(1 - np.sum((x - x_hat) ** 2) / np.sum((x - x.mean(axis=0)) ** 2))


def decoder_norms(W_dec):  # [d_sae, d_in] -> [d_sae]
    return np.sqrt(np.sum(W_dec**2, axis=-1))


def l1_penalty(f, W_dec):  # [n, d_sae], [d_sae, d_in] -> float: Σ_j f_j ‖W_dec[j]‖, averaged over the batch
    return float(np.mean(np.sum(np.abs(f) * decoder_norms(W_dec), axis=-1)))


def has_aux(d_in, dead):  # bool [d_sae] or None -> True when the AuxK loss applies: some latents dead, and SAELens's
    # k_aux = d_in // 2 at least 1 (an activation of one number leaves no dead latent to use)
    return dead is not None and bool(dead.any()) and d_in // 2 > 0


def aux_k(d_in, n_dead):  # -> (k_aux, scale): SAELens's k_aux = d_in / 2 dead latents, at most as many as are dead,
    # and the loss scaled down when fewer than d_in / 2 are dead
    return min(d_in // 2, n_dead), min(n_dead / (d_in // 2), 1.0)


def aux_activations(pre, dead, k_aux):  # [n, d_sae], bool [d_sae] -> [n, d_sae]: the k_aux largest pre-activations of
    # the dead latents, as they are (no ReLU, as SAELens), the rest zero
    return keep_at(pre, top_k_indices(np.where(dead, pre, -np.inf), k_aux))


def loss_and_grads(x, params, architecture, k=None, l1=0.0, dead=None, apply_b_dec_to_input=True, target=None):
    """[n, d_in] -> (losses {"mse", "l1" or "aux"}: floats, grads {name: like params}, stats): the training loss of a
    batch (the sum of the losses) and its gradient with respect to each of W_enc, b_enc, W_dec, b_dec (and W_skip,
    when params hold one). dead: bool [d_sae], the latents that have not fired for a while (topk's AuxK loss; None or
    none dead: no AuxK loss). target: [n, d_in], what x̂ reconstructs (a transcoder's MLP output); x when None.
    stats: what a training run reports, batch_stats's."""
    W_enc, b_enc, W_dec, b_dec = params["W_enc"], params["b_enc"], params["W_dec"], params["b_dec"]
    n = x.shape[0]
    y = x if target is None else target  # [n, d_in]
    x_in = x - b_dec * apply_b_dec_to_input  # [n, d_in]
    pre = x_in @ W_enc + b_enc  # [n, d_sae]
    f = activation(pre, architecture, k)  # [n, d_sae]
    x_hat = f @ W_dec + b_dec + skip(params, x)  # [n, d_in]
    losses = {"mse": mse(x_hat, y)}
    d_x_hat = 2 * (x_hat - y) / n  # mse = (1/n) Σ ‖x̂ - y‖²
    d_W_dec = f.T @ d_x_hat  # x̂ = f W_dec + b_dec
    d_b_dec = d_x_hat.sum(axis=0)
    d_f = d_x_hat @ W_dec.T
    if architecture == "standard":
        norms = decoder_norms(W_dec)  # [d_sae]
        losses["l1"] = l1 * l1_penalty(f, W_dec)
        d_f = d_f + l1 * norms / n  # l1 · (1/n) Σ f_j ‖W_dec[j]‖, with f ≥ 0
        d_W_dec = d_W_dec + l1 * (f.sum(axis=0) / n / norms)[:, None] * W_dec  # ∂‖w‖/∂w = w / ‖w‖
    d_pre = d_f * (f > 0)  # ReLU, and topk's mask: f = pre where a latent is kept and positive, else 0
    if architecture == "topk" and has_aux(x.shape[-1], dead):
        k_aux, scale = aux_k(x.shape[-1], int(dead.sum()))
        aux = aux_activations(pre, dead, k_aux)  # [n, d_sae]
        residual = y - x_hat  # what the live latents missed: a target, no gradient flows into it
        error = aux @ W_dec - residual  # [n, d_in]
        losses["aux"] = AUX_COEFFICIENT * scale * float(np.mean(np.sum(error**2, axis=-1)))
        d_error = AUX_COEFFICIENT * scale * 2 * error / n
        d_W_dec = d_W_dec + aux.T @ d_error
        d_pre = d_pre + (d_error @ W_dec.T) * (aux != 0)  # aux = pre where kept, else 0
    d_W_enc = (d_pre.T @ x_in).T  # pre = x_in W_enc + b_enc; as xᵀ d_pre, which OpenBLAS computes far slower
    d_b_enc = d_pre.sum(axis=0)
    if apply_b_dec_to_input:
        d_b_dec = d_b_dec - d_pre.sum(axis=0) @ W_enc.T  # x_in = x - b_dec
    grads = {"W_enc": d_W_enc, "b_enc": d_b_enc, "W_dec": d_W_dec, "b_dec": d_b_dec}
    if "W_skip" in params:
        grads["W_skip"] = d_x_hat.T @ x  # x̂ += x W_skipᵀ
    return losses, grads, batch_stats(y, x_hat, (f > 0).sum(axis=-1), (f > 0).any(axis=0))


def batch_stats(x, x_hat, active, fired):  # [n, d_in] x2, int [n], bool [d_sae] -> {"explained_variance", "l0",
    # "fired"}: how well x̂ explains the batch, how many latents each row uses on average, which latents fired
    return {"explained_variance": explained_variance(x_hat, x), "l0": float(np.mean(active)), "fired": fired}


# --- The SAE, as a folder holds it ---


class SAE:
    """An SAE: .params (float32 W_enc, b_enc, W_dec, b_dec, and threshold for jumprelu), .cfg (SAELens's cfg.json as
    a dict), .hook (the trace name it reads: "blocks.0.out", "blocks.1.attn.z", ...), .d_in, .d_sae, .architecture,
    .k; encode(x) and decode(f). files.py reads (load_sae_folder) and writes (save_sae) it as SAELens does."""

    def __init__(self, cfg, params, hook):
        self.cfg, self.params, self.hook = cfg, params, hook
        self.architecture, self.k = cfg["architecture"], cfg.get("k")
        self.d_in, self.d_sae = params["W_enc"].shape
        self.apply_b_dec_to_input = bool(cfg.get("apply_b_dec_to_input", True))

    def encode(self, x):  # [..., d_in] -> [..., d_sae]
        return encode(np.asarray(x, dtype=np.float32), **self.params, architecture=self.architecture, k=self.k,
                      apply_b_dec_to_input=self.apply_b_dec_to_input)

    def decode(self, f):  # [..., d_sae] -> [..., d_in]
        return decode(np.asarray(f, dtype=np.float32), **self.params)

    def reconstruct(self, x):  # [..., d_in] -> [..., d_in]
        return self.decode(self.encode(x))

    def __repr__(self):
        return f"SAE({self.architecture}, {self.d_in} -> {self.d_sae} latents, hook {self.hook})"
