"""SAELens's evaluation metrics (its evals.py: get_recons_loss, get_downstream_reconstruction_metrics,
get_sparsity_and_variance_metrics), one function each, computed as it computes them: on the activation the SAE reads
(TransformerLens's, processing.model_activation) and the SAE's output for it, all rows of the evaluation at once
(SAELens's one batch).

    ce_loss_score       (CE with the activation zeroed - CE with the SAE) / (CE zeroed - CE clean): loss recovered
    kl_div_score        (KL zeroed - KL with the SAE) / KL zeroed; KL(clean ‖ edited) per position, averaged
    explained_variance  1 - E‖x - x̂‖² / (E‖x‖² - ‖E x‖²), over every row (its current formula)
    l0, l1              latents firing per row, and the sum of their activations, averaged
    cossim              cos(x, x̂), averaged over rows; torch's eps 1e-8 under each norm, so a zero x̂ has cos 0
    l2_ratio            ‖x̂‖ / ‖x‖ (an ‖x‖ under 1e-4 counts as 1), averaged: below 1 is shrinkage
    relative_reconstruction_bias  E‖x̂‖² / E[x·x̂] (Wright and Sharkey's, arXiv 2404.16014 eq. 10); None where
                        E[x·x̂] is 0 (an SAE whose output is all zeros)
    feature_density     per latent, the fraction of rows where it fires
"""
import numpy as np

EPS = 1e-8  # torch.nn.functional.cosine_similarity's


def kl_per_position(clean_logits, edited_logits):  # [n, n_vocab] x2 -> float64 [n]: KL(clean ‖ edited) at each position
    clean, edited = (log_probabilities(logits) for logits in (clean_logits, edited_logits))
    return np.sum(np.exp(clean) * (clean - edited), axis=-1)


def log_probabilities(logits):  # [n, n_vocab] -> float64 [n, n_vocab]
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def score(with_sae, zeroed, clean=0.0):  # -> (zeroed - with_sae) / (zeroed - clean), None where zeroing changes nothing
    return (zeroed - with_sae) / (zeroed - clean) if zeroed != clean else None


def reconstruction_metrics(x, x_hat, f):  # [n, d_in] x2, [n, d_sae] -> {name: float}: evals.py's per-row metrics
    x, x_hat = np.asarray(x, np.float64), np.asarray(x_hat, np.float64)
    residual = np.sum((x - x_hat) ** 2, axis=-1)  # [n]
    total_variance = np.mean(np.sum(x**2, axis=-1)) - np.sum(x.mean(axis=0) ** 2)
    norm_in, norm_out = np.linalg.norm(x, axis=-1), np.linalg.norm(x_hat, axis=-1)
    return {"mse": float(residual.mean()),
            "explained_variance": float(1 - residual.mean() / total_variance) if total_variance >= 1e-10 else
            float(residual.mean() < 1e-10),
            "l0": float(np.mean(np.sum(f != 0, axis=-1))), "l1": float(np.mean(np.sum(np.abs(f), axis=-1))),
            "cossim": float(np.mean(np.sum(x * x_hat, axis=-1) / np.maximum(norm_in, EPS) / np.maximum(norm_out, EPS))),
            "l2_ratio": float(np.mean(norm_out / np.where(np.abs(norm_in) < 1e-4, 1, norm_in))),
            "relative_reconstruction_bias": ratio(np.mean(norm_out**2), np.mean(np.sum(x * x_hat, axis=-1)))}


def ratio(numerator, denominator):  # -> float numerator / denominator, None where the denominator is 0
    return float(numerator / denominator) if denominator != 0 else None


def feature_density(f):  # [n, d_sae] -> float64 [d_sae]: the fraction of rows where each latent fires
    return np.mean(f != 0, axis=0)
