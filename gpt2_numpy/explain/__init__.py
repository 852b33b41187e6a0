"""Look inside GPT-2: the attention blog posts' walkthrough on the model's own weights, every activation by name, the
logit lens, and an interactive page of every head, all composed of model.py's textbook functions.

    python -m gpt2_numpy.explain "The cat sat on the mat" --layer 5 --head 1       # the walkthrough
    python -m gpt2_numpy.explain "The cat sat on the mat" --head all --plot heads.png
    python -m gpt2_numpy.explain "The cat sat on the mat" --lens                   # the logit lens, as a table
    python -m gpt2_numpy.explain "The cat sat on the mat" --heads                  # which heads learned which pattern
    python -m gpt2_numpy.explain "The cat sat on the mat" --html page.html         # every head, in a browser

The rooms: stepwise.py (the walkthrough: one head step by step, printed), tracing.py (trace and logit_lens),
lens.py (the lens's table), heads.py (the head scores), page.py with page.html (the page), plot.py (--plot), files.py
(the files written), and cli.py (the command line).
"""
from gpt2_numpy.explain.cli import main
from gpt2_numpy.explain.heads import head_scores, repeated_tokens
from gpt2_numpy.explain.tracing import attention_weights, logit_lens, trace
from gpt2_numpy.explain.stepwise import report, token_label, walkthrough

__all__ = ["attention_weights", "head_scores", "logit_lens", "main", "repeated_tokens", "report", "token_label",
           "trace", "walkthrough"]
