"""SAE latent attribution: for an SAE on one activation, each latent's activation times the metric's gradient with
respect to it, at each position, from one forward and one backward pass (gradients, interpret/gradients.py).

    scores = latent_attribution(ids, params, n_head, sae, logit_difference(a, b))   # [n_seq, d_sae]
    value, f, d_f = latent_gradients(ids, params, n_head, sae, logit_difference(a, b))

A latent's gradient is its decoder row, as the SAE writes it into the activation, dotted with the gradient at the
activation: W_dec[j] times σ for an SAE that layer-normalises its input (its decoder writes in the normalised space,
sae/processing.py's output_scale), per-head activations (attn.z) read as rows of heads side by side as the SAE reads
them. spliced=True replaces the activation by the SAE's reconstruction (as `sae eval` splices it) and takes the
gradient of that run; spliced=False keeps the model's own run, as if the SAE's error were added back (the gradient at
the activation itself). An SAE is any object with encode, reconstruct, params["W_dec"] and hook, a trace name.
"""
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.gradients import run_gradients
from gpt2_numpy.sae.activations import at_hook, hook_rows
from gpt2_numpy.sae.processing import output_scale


def latent_attribution(ids, params, n_head, sae, metric, spliced=True):  # int [n_seq] -> float32 [n_seq, d_sae]
    _, activations, gradients = latent_gradients(ids, params, n_head, sae, metric, spliced)
    return activations * gradients


def latent_gradients(ids, params, n_head, sae, metric, spliced=True):  # -> value, f, d_f: [n_seq, d_sae] each
    """The metric's value on the run, each latent's activation f and the metric's gradient d_f with respect to it."""
    seen = {}

    def read(rows):  # [n_seq, d_in] -> what the run carries on: the reconstruction when spliced; the input is kept
        seen["rows"] = rows
        return sae.reconstruct(rows) if spliced else rows

    arrays = run_with_edits(ids, params, n_head, [Edit(sae.hook, at_hook(read, sae.hook))])
    # the gradient recorded at the SAE's activation is the metric's through what the run carried on from there
    value, grads = run_gradients(arrays, params, n_head, metric, [sae.hook])
    rows, d_rows = seen["rows"], hook_rows(grads[sae.hook], sae.hook)  # [n_seq, d_in] each
    return value, sae.encode(rows), (d_rows * output_scale(sae, rows)) @ sae.params["W_dec"].T
