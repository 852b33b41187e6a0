"""An SAE measured on held-out text, spliced into the model at its hook, as SAELens's evals measure one:

    L_clean, L_sae, L_zero   the next-token loss (nats per token) of the model as it is, with the SAE's
                             reconstruction in place of the activation, and with the activation zeroed
    loss recovered           (L_zero - L_sae) / (L_zero - L_clean): 1 when the SAE loses nothing, 0 when it is no
                             better than no activation at all
    mse, explained variance, L0 (latents active per position), dead latents (none fired on the text)
    SAELens's metrics (metrics.py): the CE and KL scores, L1, cossim, l2 ratio, relative reconstruction bias, feature
    density, on the activation the SAE reads (TransformerLens's, processing.model_activation)
"""
import numpy as np

from gpt2_numpy.interpret.edits import run_with_edits
from gpt2_numpy.interpret.tracing import log_softmax
from gpt2_numpy.sae.activations import hook_rows, splice, zeroed_activation
from gpt2_numpy.sae.files import check_fits
from gpt2_numpy.sae.metrics import feature_density, kl_per_position, reconstruction_metrics, score
from gpt2_numpy.sae.processing import forward, model_activation
from gpt2_numpy.sae.releases import published


def evaluate(sae, params, n_head, windows):  # int [n_windows, seq_len + 1] -> {name: number} over the windows
    totals, kl = {"clean": 0.0, "sae": 0.0, "zero": 0.0}, {"sae": [], "zero": []}
    rows, n_targets = [], 0
    for window in windows:
        inputs, targets = window[:-1], window[1:]
        logits = {}
        for name, edits in (("clean", []), ("sae", [splice(sae)]), ("zero", [zeroed_activation(sae)])):
            names = run_with_edits(inputs, params, n_head, edits)
            logits[name] = names["logits"]
            totals[name] -= float(np.take_along_axis(log_softmax(names["logits"]), targets[:, None], -1).sum())
            if name == "clean":
                x = hook_rows(names[sae.hook], sae.hook)
                check_fits(sae, x.shape[-1], f"the model's {sae.hook}")
                a = model_activation(sae, x)  # what SAELens's evals read: TransformerLens's activation
                rows.append((a, forward(sae, a), sae.encode(x)))
        for name in kl:
            kl[name].append(kl_per_position(logits["clean"], logits[name]))
        n_targets += len(targets)
    a, a_hat, f = (np.concatenate(part) for part in zip(*rows))
    losses = {name: total / n_targets for name, total in totals.items()}
    kl_sae, kl_zero = (float(np.concatenate(kl[name]).mean()) for name in ("sae", "zero"))
    density = feature_density(f)
    return {"L_clean": losses["clean"], "L_sae": losses["sae"], "L_zero": losses["zero"],
            "loss_recovered": score(losses["sae"], losses["zero"], losses["clean"]),  # SAELens's ce_loss_score: None
            # where zeroing the activation leaves the loss as it is
            "kl_div_with_sae": kl_sae, "kl_div_with_ablation": kl_zero, "kl_div_score": score(kl_sae, kl_zero),
            **reconstruction_metrics(a, a_hat, f), "dead_latents": int((density == 0).sum()),
            "feature_density": density.tolist(), "d_sae": sae.d_sae, "tokens": n_targets, "hook": sae.hook,
            "published": published(sae)}
