"""An SAE measured on held-out text, spliced into the model at its hook, as SAELens's evals measure one:

    L_clean, L_sae, L_zero   the next-token loss (nats per token) of the model as it is, with the SAE's
                             reconstruction in place of the activation, and with the activation zeroed
    loss recovered           (L_zero - L_sae) / (L_zero - L_clean): 1 when the SAE loses nothing, 0 when it is no
                             better than no activation at all
    mse, explained variance, L0 (latents active per position), dead latents (none fired on the text)
"""
import numpy as np

from gpt2_numpy.interpret.edits import run_with_edits
from gpt2_numpy.interpret.tracing import log_softmax
from gpt2_numpy.sae.activations import hook_rows, splice, zeroed
from gpt2_numpy.sae.files import check_fits
from gpt2_numpy.sae.model import explained_variance, mse


def evaluate(sae, params, n_head, windows):  # int [n_windows, seq_len + 1] -> {name: number} over the windows
    totals = {"clean": 0.0, "sae": 0.0, "zero": 0.0}
    rows, fired, n_targets = [], np.zeros(sae.d_sae, bool), 0
    for window in windows:
        inputs, targets = window[:-1], window[1:]
        for name, edits in (("clean", []), ("sae", [splice(sae)]), ("zero", [zeroed(sae.hook)])):
            names = run_with_edits(inputs, params, n_head, edits)
            totals[name] -= float(np.take_along_axis(log_softmax(names["logits"]), targets[:, None], -1).sum())
            if name == "clean":
                x = hook_rows(names[sae.hook], sae.hook)
                check_fits(sae, x.shape[-1], f"the model's {sae.hook}")
                f = sae.encode(x)
                rows.append((x, sae.decode(f), (f > 0).sum(axis=-1)))
                fired |= (f > 0).any(axis=0)
        n_targets += len(targets)
    x, x_hat, active = (np.concatenate(part) for part in zip(*rows))
    losses = {name: total / n_targets for name, total in totals.items()}
    change = losses["zero"] - losses["clean"]  # none: zeroing the activation leaves the loss as it is
    recovered = (losses["zero"] - losses["sae"]) / (losses["zero"] - losses["clean"]) if change else None
    return {"L_clean": losses["clean"], "L_sae": losses["sae"], "L_zero": losses["zero"],
            "loss_recovered": recovered, "mse": mse(x_hat, x),
            "explained_variance": explained_variance(x_hat, x), "l0": float(np.mean(active)),
            "dead_latents": int((~fired).sum()), "d_sae": sae.d_sae, "tokens": n_targets, "hook": sae.hook}

