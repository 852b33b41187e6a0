"""An SAE measured on held-out text, spliced into the model at its hook, as SAELens's evals measure one:

    L_clean, L_sae, L_zero   the next-token loss (nats per token) of the model as it is, with the SAE's
                             reconstruction in place of the activation, and with the activation zeroed
    loss recovered           (L_zero - L_sae) / (L_zero - L_clean): 1 when the SAE loses nothing, 0 when it is no
                             better than no activation at all
    mse, explained variance, L0 (latents active per position), dead latents (none fired on the text)
    SAELens's metrics (metrics.py): the CE and KL scores, L1, cossim, l2 ratio, relative reconstruction bias, feature
    density, on the activation the SAE reads (TransformerLens's, processing.model_activation)

Transcoders (evaluate_transcoders) are measured the same way with the MLPs as the activation: L_replaced with every
MLP of the set replaced by its transcoder (sae/replacement.py), L_zero with those MLPs' outputs zeroed, and per
layer the mse, explained variance and L0 of each transcoder's output against its MLP's, on the clean run.
"""
import numpy as np

from gpt2_numpy.sae.replacement import replacement_edits
from gpt2_numpy.sae.transcoder_model import decode, encode, input_name, output_name, transcoder_input
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.tracing import log_softmax
from gpt2_numpy.sae.activations import hook_rows, splice, zeroed_activation
from gpt2_numpy.sae.files import check_fits
from gpt2_numpy.sae.metrics import feature_density, kl_per_position, reconstruction_metrics, score
from gpt2_numpy.sae.processing import forward, model_activation
from gpt2_numpy.sae.releases import published


def token_loss(logits, targets):  # [n_seq, n_vocab], int [n_seq] -> float: the next-token losses summed (nats)
    return -float(np.take_along_axis(log_softmax(logits), targets[:, None], -1).sum())


def evaluate(sae, params, n_head, windows):  # int [n_windows, seq_len + 1] -> {name: number} over the windows
    totals, kl = {"clean": 0.0, "sae": 0.0, "zero": 0.0}, {"sae": [], "zero": []}
    rows, n_targets = [], 0
    for window in windows:
        inputs, targets = window[:-1], window[1:]
        logits = {}
        for name, edits in (("clean", []), ("sae", [splice(sae)]), ("zero", [zeroed_activation(sae)])):
            names = run_with_edits(inputs, params, n_head, edits)
            logits[name] = names["logits"]
            totals[name] += token_loss(names["logits"], targets)
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


def evaluate_transcoders(transcoders, layers, params, n_head, windows):  # int [n_windows, seq_len + 1] -> {name:
    # number}: the set's transcoders in place of the MLPs of `layers` (the set's i-th replaces MLP layers[i])
    placed = placed_set(transcoders, layers, len(params["blocks"]))
    runs = {"clean": [], "replaced": replacement_edits(placed, layers),
            "zero": [Edit(output_name(transcoders.output_hook, layer), np.zeros_like) for layer in layers]}
    totals, parts, n_targets = dict.fromkeys(runs, 0.0), [], 0
    for window in windows:
        inputs, targets = window[:-1], window[1:]
        for name, edits in runs.items():
            names = run_with_edits(inputs, params, n_head, edits)
            totals[name] += token_loss(names["logits"], targets)
            if name == "clean":
                parts.append([transcoder_outputs(placed, layer, names) for layer in layers])
        n_targets += len(targets)
    losses = {name: total / n_targets for name, total in totals.items()}
    per_layer = []
    for layer, outputs in zip(layers, zip(*parts)):
        y, y_hat, features = (np.concatenate(part) for part in zip(*outputs))
        metrics = reconstruction_metrics(y, y_hat, features)
        per_layer.append({"layer": layer, **{name: metrics[name] for name in ("mse", "explained_variance", "l0")},
                          "dead_features": int((feature_density(features) == 0).sum())})
    return {"L_clean": losses["clean"], "L_replaced": losses["replaced"], "L_zero": losses["zero"],
            "loss_recovered": score(losses["replaced"], losses["zero"], losses["clean"]), "layers": per_layer,
            "d_transcoder": transcoders.d_transcoder, "skip": transcoders.skip, "tokens": n_targets,
            "input_hook": transcoders.input_hook}


def placed_set(transcoders, layers, n_layer):  # -> the set with its i-th transcoder at layers[i] of n_layer, None
    # elsewhere: a set of some layers, indexed by the model's layer as replacement_edits indexes it
    placed = [None] * n_layer
    for layer, transcoder in zip(layers, transcoders.layers):
        placed[layer] = transcoder
    return transcoders._replace(layers=placed)


def transcoder_outputs(transcoders, layer, names):  # -> ([n_seq, d_model] the MLP's output, [n_seq, d_model] the
    # transcoder's, [n_seq, d_transcoder] its features) of layer `layer` on a clean run's arrays
    params = transcoders.layers[layer]
    x = transcoder_input(transcoders.input_hook, names[input_name(transcoders.input_hook, layer)])
    features = encode(params, x)
    return names[output_name(transcoders.output_hook, layer)], decode(params, features, x), features
