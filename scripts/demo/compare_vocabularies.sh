#!/usr/bin/env bash
# The training page's two Shakespeare models, side by side: the same 4-layer, 256-wide GPT-2 trained from scratch
# with GPT-2's 50,257-token vocabulary and with its own 4,096-token BPE, for the same wall-clock time, at the same
# time, one core each (so both see the same machine), then scored on the same held-out play.
#
#   scripts/demo/compare_vocabularies.sh [OUT] [SECONDS]   (OUT: a new folder, default ../vocab-demo, outside the
#                                                          repo; SECONDS: the budget of each run, default 1680, 28 minutes)
# Needs ../shared/corpus/shakespeare-plays.txt and two cores. Each run gets Ctrl-C at the budget (it saves the step in
# progress); --steps are what each reaches in that time on a quiet core, so both schedules are nearly done by then.
# Prints each model's held-out bits per byte, tokens/s, a sample and its head scores.
set -euo pipefail
OUT=${1:-}
[ -z "$OUT" ] || [ "${OUT#/}" != "$OUT" ] || OUT="$PWD/$OUT"  # the caller's OUT, from the caller's folder
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OPENBLAS_NUM_THREADS=1  # one core each, nothing shared
OUT=${OUT:-$PWD/../vocab-demo}
SECONDS_EACH=${2:-1680}
CORPUS=../shared/corpus/shakespeare-plays.txt
SHAPE="--n-layer 4 --n-head 4 --n-embd 256 --n-ctx 128 --seq-len 128 --batch-size 8 --lr 1e-3 --warmup 50"
RUN="--eval-every 50 --eval-batches 2 --save-every 200 --seed 0"
PROMPT="KING HENRY. Now, lords, what say you to the French king? Shall we go to him, or stay here in England?"

# made afresh: this script deletes nothing, not even its own earlier output
[ ! -e "$OUT" ] || { echo "error: $OUT exists: pass an OUT that does not exist yet" >&2; exit 2; }
[ -f "$CORPUS" ] || { echo "error: $CORPUS is missing: place ../shared/corpus beside the repo" >&2; exit 2; }
mkdir -p "$OUT"
# the corpus's last play, The Winter's Tale: inside the held-out tail (the last 10%) of both runs
python -c "import sys; t = open(sys.argv[1], encoding='utf-8').read(); \
print(t[t.rindex(\"THE WINTER'S TALE\", 0, t.index('by William Shakespeare', len(t) - 200000)):], end='')" \
  "$CORPUS" > "$OUT/heldout-play.txt"

timeout -s INT "$SECONDS_EACH" taskset -c 0 python -m gpt2_numpy train --data "$CORPUS" --out "$OUT/gpt2-vocab" \
  $SHAPE $RUN --steps 650 2> "$OUT/gpt2-vocab.log" &
timeout -s INT "$SECONDS_EACH" taskset -c 1 python -m gpt2_numpy train --data "$CORPUS" --out "$OUT/own-vocab" \
  $SHAPE $RUN --steps 1800 --vocab-size 4096 2> "$OUT/own-vocab.log" &
wait || true  # a run stopped at the budget exits 130, its step saved

for model in gpt2-vocab own-vocab; do
  echo "== $model: $(tail -1 "$OUT/$model/log.csv" | cut -d, -f1) steps, $(tail -1 "$OUT/$model/log.csv" | cut -d, -f7) tokens"
  python -m gpt2_numpy score --model "$OUT/$model" --data "$OUT/heldout-play.txt" --json
  python -m gpt2_numpy generate --model "$OUT/$model" "ROMEO." --n-tokens 80 --temperature 0.8 --top-k 40 --seed 0
  python -m gpt2_numpy explain --model "$OUT/$model" --heads "$PROMPT"
done
