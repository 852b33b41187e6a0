"""Pick the heads that scripts/demo/induction.sh ablates, from `explain --heads --json` on stdin, and say whether each
formed: stdout gets "INDUCTION PREVIOUS" (layer.head each), stderr one line per head.

    python -m gpt2_numpy.explain --model OUT - --heads --json < TEXT | python -m scripts.demo.induction_heads

The induction head is the best one in layer 1 or later (it reads what a head before it wrote), the previous-token head
the best one in a layer before it. A head of a kind has formed when it puts over half its weight on the key its pattern
names: that key then gets more than all the others together, where even weights (the table's `uniform` line) give it
about 1/n. The best head of a run stopped early scores about what even weights do: that is no head at all, and the
ablations that follow measure a head that does nothing in particular.
"""
import json
import sys

from gpt2_numpy.interpret.heads import prompt_scores, repeat_scores, uniform_weights

FORMED = 0.5  # a pattern's score above which its key gets most of the head's weight
KINDS = {"induction": "the token after the earlier copy of the current one",
         "previous_token": "the token just before"}


def uniform(result):  # -> {pattern: the score of a head that spreads its weight evenly} on result's prompt and probe
    ids, repeated = result["prompt_ids"], result["repeated_ids"]
    return {**prompt_scores(uniform_weights(len(ids))),
            **repeat_scores(uniform_weights(len(repeated)), (len(repeated) - 1) // 2)}


def best_heads(heads):  # -> (the best induction head's row, the best previous-token head's row in a layer before it)
    induction = max((row for row in heads if row["layer"] >= 1), key=lambda row: row["induction"])
    previous = max((row for row in heads if row["layer"] < induction["layer"]), key=lambda row: row["previous_token"])
    return induction, previous


def verdict(row, pattern, even):  # -> one line: the head of this kind that formed, or that none did
    kind, name, score = pattern.replace("_", "-"), f"{row['layer']}.{row['head']}", row[pattern]
    if score > FORMED:
        return f"{kind} head {name}: {score:.3f} of its weight on {KINDS[pattern]} (uniform {even:.3f})"
    return (f"no {kind} head formed: the best, {name}, puts {score:.3f} of its weight on {KINDS[pattern]} (uniform "
            f"{even:.3f}; a head of this kind puts over {FORMED})")


def main():
    result = json.load(sys.stdin)
    induction, previous = best_heads(result["heads"])
    even = uniform(result)
    for row, pattern in ((induction, "induction"), (previous, "previous_token")):
        print(verdict(row, pattern, float(even[pattern])), file=sys.stderr)
    print(f"{induction['layer']}.{induction['head']} {previous['layer']}.{previous['head']}")


if __name__ == "__main__":
    main()
