#!/usr/bin/env bash
# The README's trained model, regenerated from seed 0: a 4-layer GPT-2 trained from scratch on 36 of Shakespeare's
# plays, its loss curve, a sample, and the attention of its most recognisable head beside the same head before
# training. About half an hour on two cores.
#
#   scripts/demo/train_shakespeare.sh [OUT]  (OUT: a new model folder, default ../demo-model, outside the repo: the
#                                            weights are too big to commit)
# Needs ../shared/corpus/shakespeare-plays.txt, and matplotlib for the pictures; the tokenizer is the packaged one.
# Writes docs/train-*.png and OUT/sample.txt.
set -euo pipefail
OUT=${1:-}
[ -z "$OUT" ] || [ "${OUT#/}" != "$OUT" ] || OUT="$PWD/$OUT"  # the caller's OUT, from the caller's folder
cd "$(dirname "$0")/../.."  # the repo root
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/../demo-model}
CORPUS=../shared/corpus/shakespeare-plays.txt
PROMPT="KING HENRY. Now, lords, what say you to the French king? Shall we go to him, or stay here in England?"

for folder in "$OUT" "$OUT-init"; do  # both made afresh: this script deletes nothing, not even its own earlier run
  [ ! -e "$folder" ] || { echo "error: $folder exists: pass an OUT that does not exist yet" >&2; exit 2; }
done
[ -f "$CORPUS" ] || { echo "error: $CORPUS is missing: place ../shared/corpus beside the repo" >&2; exit 2; }
# the same model at step 0 (GPT-2's initialisation, seed 0): the "before" picture
python -m gpt2_numpy.train --data "$CORPUS" --out "$OUT-init" \
  --n-layer 4 --n-head 4 --n-embd 256 --n-ctx 128 --seed 0 --steps 0
python -m gpt2_numpy.train --data "$CORPUS" --out "$OUT" \
  --n-layer 4 --n-head 4 --n-embd 256 --n-ctx 128 --seq-len 128 --batch-size 8 --steps 650 --lr 1e-3 --warmup 50 \
  --eval-every 50 --eval-batches 2 --save-every 200 --seed 0
python -m scripts.demo.plot_loss "$OUT/log.csv" docs/train-loss.png
python -m gpt2_numpy.generate --model "$OUT" "ROMEO." --n-tokens 80 --temperature 0.8 --top-k 40 --seed 0 \
  | tee "$OUT/sample.txt"
# score every head (explain --heads); the one with the highest previous-token or induction score is drawn for both
python -m gpt2_numpy.explain --model "$OUT" "$PROMPT" --heads >&2
read -r LAYER HEAD < <(python -m gpt2_numpy.explain --model "$OUT" "$PROMPT" --heads --json | python -c '
import json, sys
heads = json.load(sys.stdin)["heads"]
best = max(heads, key=lambda row: max(row["previous_token"], row["induction"]))
print(best["layer"], best["head"])')
for model in "$OUT" "$OUT-init"; do
  name=$([ "$model" = "$OUT" ] && echo trained || echo init)
  python -m gpt2_numpy.explain --model "$model" "$PROMPT" --layer "$LAYER" --head "$HEAD" \
    --plot "docs/train-attention-$name.png" > /dev/null
done
