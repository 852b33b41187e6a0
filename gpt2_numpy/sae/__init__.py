"""Sparse autoencoders (SAEs) on GPT-2's activations, in NumPy, read and written as SAELens's folders.

    sae = load_sae("my-sae")                       # an SAE folder: SAELens's, or gpt2-numpy sae train's
    f = sae.encode(x)                              # [..., d_in] -> [..., d_sae], mostly zeros
    names = run_with_edits(ids, params, n_head, [splice(sae)])   # the model with the SAE in place of sae.hook

The rooms, as model.py beside fast.py: model.py (the textbook math: encode, decode, the losses and their gradients, the
SAE class), fast.py (topk's tuned training step); files.py (SAELens's folders); activations.py (an activation as rows,
the shuffling stream, where a run's activations come from, text into windows of tokens); training.py (the training loop
and its run folder) with transcoders.py (a transcoder run's hooks, and its circuit-tracer set); transcoder_model.py (a
transcoder's math), transcoder_files.py (circuit-tracer's transcoder sets) and replacement.py (transcoders spliced in
for the MLPs); attribution.py (each latent's activation times a metric's gradient); evaluation.py (loss
recovered and the rest, the SAE or transcoders spliced into the model) with metrics.py (SAELens's evals.py metrics);
releases.py (SAELens's released SAEs by name, downloaded once) with processing.py (the activation each was trained on:
TransformerLens's processed model, layer-normalised inputs); features.py (latents on a model: which fire where, their
logit effects, ablation and steering), page.py with features.html (the page of latents); present.py (the tables and JSON
that the commands print). The command line is gpt2_numpy/commands/sae.py (`gpt2-numpy sae`, or `python -m gpt2_numpy
sae`) and explain's --sae flags.
"""
from gpt2_numpy.sae.activations import splice
from gpt2_numpy.sae.features import latent_activations, logit_effects, strongest_latents
from gpt2_numpy.sae.files import new_sae, save_sae
from gpt2_numpy.sae.releases import load_sae
from gpt2_numpy.sae.model import SAE, decode, encode

__all__ = ["SAE", "decode", "encode", "latent_activations", "load_sae", "logit_effects", "new_sae", "save_sae",
           "splice", "strongest_latents"]
