"""Look inside GPT-2: the attention blog posts' walkthrough on the model's own weights, every activation by name, the
logit lens, head scores and an interactive page of every head, all composed of model.py's textbook functions. The
command line that prints and writes them is gpt2_numpy/commands/explain.py (`gpt2-numpy explain`).

    activations = trace(ids, params, n_head)   # every activation by name: "blocks.3.attn.weights", ...
    logits = logit_lens(ids, params, n_head)   # [n_layer + 1, n_seq, n_vocab]: the next token after each layer

The rooms: names.py (every activation's name, and TransformerLens's), tracing.py (trace and logit_lens), stepwise.py
(the walkthrough: one head step by step, printed), lens.py (the lens's top tokens), heads.py (the head scores), page.py
with page.html (the page), plot.py (--plot's figures); edits.py (a forward pass with edits: run_with_edits) and the
three techniques built on it, ablation.py, attribution.py and patching.py; gradients.py (its backward: a metric's
gradient at every activation); present.py (every technique's table and JSON). Sparse autoencoders, which read these
activations, are the package beside this one, gpt2_numpy/sae/.
"""
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.gradients import gradients
from gpt2_numpy.interpret.heads import head_scores, repeated_tokens
from gpt2_numpy.interpret.stepwise import report, token_label, walkthrough
from gpt2_numpy.interpret.tracing import attention_weights, logit_lens, trace

__all__ = ["Edit", "attention_weights", "gradients", "head_scores", "logit_lens", "repeated_tokens", "report",
           "run_with_edits", "token_label", "trace", "walkthrough"]
