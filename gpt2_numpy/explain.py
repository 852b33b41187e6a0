"""`python -m gpt2_numpy.explain` runs the explain command (gpt2_numpy/commands/explain.py); looking inside GPT-2
lives in gpt2_numpy/interpret/, and its public names are kept importable from here."""
from gpt2_numpy.interpret import (
    attention_weights, head_scores, logit_lens, repeated_tokens, report, token_label, trace, walkthrough,
)

__all__ = ["attention_weights", "head_scores", "logit_lens", "repeated_tokens", "report", "token_label", "trace",
           "walkthrough"]

if __name__ == "__main__":
    from gpt2_numpy.commands.explain import main

    main()
