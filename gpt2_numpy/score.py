"""`python -m gpt2_numpy.score` runs the score command (gpt2_numpy/commands/score.py); the scoring itself lives in
gpt2_numpy/likelihood.py, and its public names are kept importable from here."""
from gpt2_numpy.likelihood import (
    iter_log_probs, perplexity, score_windows, scored_bytes, summary, text_ids, token_log_probs,
)

__all__ = ["iter_log_probs", "perplexity", "score_windows", "scored_bytes", "summary", "text_ids", "token_log_probs"]

if __name__ == "__main__":
    from gpt2_numpy.commands.score import main

    main()
