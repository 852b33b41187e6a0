#!/usr/bin/env bash
# Watch an induction head form: a 2-layer GPT-2 (layer norms, MLPs, learned positions: the model as it is) trained
# from scratch on a text in which only content-based induction predicts anything (scripts/demo/induction_text.py), its
# loss and best induction score against the step, and the loss on a repeated text it never saw, before and after
# zero-ablating the induction head and the previous-token head that feeds it.
#
#   scripts/demo/induction.sh [--seed S] [--threads N] [--n-head H --n-embd W] OUT [STEPS]
#   OUT: a new folder; STEPS: train this many steps instead of 10,000, e.g. 2 to try the script in a minute: too few
#   for any head to form, which it then says; S: the run's seed (its init and batch order; 0), the text the same for
#   every seed; N: the cores it may use ($GPT2_NUMPY_THREADS, else the free ones); H, W: the heads a layer (3) and the
#   width (96), e.g. --n-head 4 --n-embd 64 for the model that docs/sae.md's and docs/circuits.md's demos read
# Writes OUT (the model folder, with log.csv and heads.csv), OUT/induction.png, and the two texts in OUT/texts/.
# Needs matplotlib for the picture.
set -euo pipefail
usage="usage: scripts/demo/induction.sh [--seed S] [--threads N] [--n-head H --n-embd W] OUT [STEPS]"
SEED=0
N_HEAD=3  # 3 heads of 32: with 4 heads of 16 (64 wide), layer 1 could form several induction heads at once, each
N_EMBD=96  # carrying a part of the job (docs/training.md, the tries)
while [ $# -gt 0 ]; do
  case $1 in
    --seed) SEED=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
    --threads) THREADS=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
    --n-head) N_HEAD=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
    --n-embd) N_EMBD=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
    -*) echo "error: unknown option $1: $usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
OUT=${1:?$usage}
STEPS=${2:-10000}
[ "${OUT#/}" != "$OUT" ] || OUT="$PWD/$OUT"  # the caller's OUT, from the caller's folder
cd "$(dirname "$0")/../.."  # the repo root
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

[ ! -e "$OUT" ] || { echo "error: $OUT exists: pass an OUT that does not exist yet" >&2; exit 2; }
case $STEPS in
  '' | *[!0-9]* | 0*) echo "error: STEPS $STEPS is not a whole number of steps above 0" >&2; exit 2 ;;
esac
case $SEED in
  '' | *[!0-9]*) echo "error: --seed $SEED is not a whole number (0, 1, 2, ...)" >&2; exit 2 ;;
esac
for option in "--n-head $N_HEAD" "--n-embd $N_EMBD"; do
  case ${option#* } in
    '' | *[!0-9]* | 0*) echo "error: $option is not a whole number above 0" >&2; exit 2 ;;
  esac
done
[ $((N_EMBD % N_HEAD)) = 0 ] || {
  echo "error: --n-embd $N_EMBD does not split into --n-head $N_HEAD heads of equal width: pass a multiple" >&2; exit 2; }
case ${THREADS-1} in  # unset: not given
  '' | *[!0-9]* | 0*) echo "error: --threads $THREADS is not a whole number of cores above 0" >&2; exit 2 ;;
esac
[ -z "${THREADS+given}" ] || export GPT2_NUMPY_THREADS=$THREADS  # every command below: train, explain
TEXTS=$(mktemp -d)  # until OUT holds the run: train writes only into an empty or new folder
trap 'rm -rf "$TEXTS"' EXIT
# sequences of 3 to 8 characters (5 to 14 bytes) said three times, 0 to 3 characters apart
python -m scripts.demo.induction_text "$TEXTS/train.txt" --seed 0 --copies 3  # 1.75 MB
# another seed: a text never trained on, 7 characters said twice (30 bytes, within the context)
python -m scripts.demo.induction_text "$TEXTS/unseen.txt" --seed 1 --chars 1 --lengths 7 7 --gaps 0 0
python -m gpt2_numpy.train --data "$TEXTS/train.txt" --out "$OUT" --vocab-size 257 \
  --n-layer 2 --n-head "$N_HEAD" --n-embd "$N_EMBD" --n-ctx 32 --seq-len 32 --batch-size 32 --lr 6e-3 --warmup 200 \
  --steps "$STEPS" --eval-every 250 --eval-batches 2 --save-every 2000 --seed "$SEED"
mkdir "$OUT/texts"
mv "$TEXTS/train.txt" "$TEXTS/unseen.txt" "$OUT/texts/"
python -m scripts.demo.plot_loss "$OUT/log.csv" "$OUT/induction.png" --induction

# the heads, scored by explain --heads on the unseen text (its repeated probe: seeded random bytes said twice); the
# text goes in on stdin ("-"), as it holds characters that no command-line argument may (U+0000)
UNSEEN=$OUT/texts/unseen.txt
python -m gpt2_numpy.explain --model "$OUT" - --heads < "$UNSEEN" >&2
# the best induction head and the best previous-token head before it, and whether each formed (one line each)
read -r INDUCTION PREVIOUS < <(python -m gpt2_numpy.explain --model "$OUT" - --heads --json < "$UNSEEN" |
  python -m scripts.demo.induction_heads)
for heads in "$INDUCTION" "$PREVIOUS" "$INDUCTION $PREVIOUS"; do
  # shellcheck disable=SC2086  # $heads: one or two L.H words
  python -m gpt2_numpy.explain --model "$OUT" - --ablate $heads --ablation zero --json < "$UNSEEN" | python -c '
import json, sys
result = json.load(sys.stdin)
before, after = result["loss"]["before"], result["loss"]["after"]
heads = " ".join(f"{layer}.{head}" for layer, head in result["ablated"])
print(f"zero-ablating {heads}: the loss on the unseen text goes from {before:.3f} to {after:.3f} nats per token "
      f"({after - before:+.3f})")'
done
echo "seed $SEED, $STEPS steps, threads ${GPT2_NUMPY_THREADS:-free}: $((SECONDS / 60)) min $((SECONDS % 60)) s" >&2  # the run's time
