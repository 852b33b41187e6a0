"""SAE latent attribution: for an SAE on one activation, each latent's activation times the metric's gradient with
respect to it, at each position, from one forward and one backward pass (gradients, interpret/gradients.py).

    scores = latent_attribution(ids, params, n_head, sae, logit_difference(a, b))   # [n_seq, d_sae]

The latent's gradient is its decoder row dotted with the gradient at the activation the SAE writes. spliced=True
replaces the activation by the SAE's reconstruction (as `sae eval` splices it) and takes the gradient of that run;
spliced=False keeps the model's own run, as if the SAE's error were added back (the gradient at the activation
itself). An SAE is any object with encode, decode, params["W_dec"] and hook, a trace name of an [n_seq, d_in] array.
"""
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.gradients import run_gradients


def latent_attribution(ids, params, n_head, sae, metric, spliced=True):  # int [n_seq] -> float32 [n_seq, d_sae]
    seen = {}

    def read(activation):  # -> what the run carries on: the reconstruction when spliced; the SAE's input is kept
        seen["input"] = activation
        return sae.reconstruct(activation) if spliced else activation

    arrays = run_with_edits(ids, params, n_head, [Edit(sae.hook, read)])
    # the gradient recorded at the SAE's activation is the metric's through what the run carried on from there
    _, grads = run_gradients(arrays, params, n_head, metric, [sae.hook])
    d_activation = grads[sae.hook]
    if d_activation.ndim != 2:
        raise ValueError(f"{sae.hook} is [{', '.join(map(str, d_activation.shape))}]: latent attribution reads an "
                         "[n_seq, d_in] activation")
    return sae.encode(seen["input"]) * (d_activation @ sae.params["W_dec"].T)  # [n_seq, d_sae]
