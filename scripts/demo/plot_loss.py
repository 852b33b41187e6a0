"""Plot a training run's loss curve from the log.csv that `python -m gpt2_numpy.train` writes in its --out folder;
with --induction, against the step, with the best previous-token and induction scores of each evaluation, from the
heads.csv beside it.

    python -m scripts.demo.plot_loss OUT/log.csv loss.png
    python -m scripts.demo.plot_loss OUT/log.csv induction.png --induction
"""
import argparse
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402

from gpt2_numpy.errors import Gpt2NumpyError, UsageError  # noqa: E402
from gpt2_numpy.commands.common import check_output_file, save_figure  # noqa: E402
from gpt2_numpy.interpret.plot import PLOT_SUFFIXES  # noqa: E402


def main(log_path, png_path, induction=False):
    x = "step" if induction else "tokens"
    with open(log_path, newline="") as file:
        rows = list(csv.DictReader(file))
    train = [(int(row[x]), float(row["train_loss"])) for row in rows if row["train_loss"]]
    val = [(int(row[x]), float(row["val_loss"])) for row in rows if row["val_loss"]]
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    lines = axes.plot(*zip(*train), lw=0.8, alpha=0.6, label="training batch")
    lines += axes.plot(*zip(*val), "o-", ms=3, label="held-out text")
    axes.set_xlabel("step" if induction else "tokens seen")
    axes.set_ylabel("cross-entropy (nats per token)")
    axes.set_title(f"{len(train)} steps; final held-out loss {val[-1][1]:.2f}")
    axes.grid(alpha=0.3)
    if induction:
        heads_path, right = Path(log_path).with_name("heads.csv"), axes.twinx()
        for pattern, color in (("previous_token", "C2"), ("induction", "C3")):
            lines += right.plot(*zip(*best_scores(heads_path, pattern)), "s-", color=color, ms=3,
                                label=f"best {pattern.replace('_', '-')} score (right)")
        right.set_ylim(0, 1)
        right.set_ylabel("the best head's score (explain --heads)")
    axes.legend(lines, [line.get_label() for line in lines], loc="center right")
    figure.tight_layout()
    save_figure(figure, Path(png_path))  # the whole picture, or the old file as it was
    print(f"wrote {png_path}", file=sys.stderr)


def best_scores(heads_path, pattern):  # -> [(step, the highest score of any head for pattern at that step)]
    best = {}
    with open(heads_path, newline="") as file:
        for row in csv.DictReader(file):
            best[int(row["step"])] = max(best.get(int(row["step"]), 0.0), float(row[pattern]))
    return sorted(best.items())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="the log.csv of a training run")
    parser.add_argument("png", help="the picture to write, a .png or .svg file")
    parser.add_argument("--induction", action="store_true", help="against the step, with the best previous-token and "
                        "induction scores of each evaluation, from the run's heads.csv")
    args = parser.parse_args()
    try:  # the picture's name and folder first, as explain --plot checks them: a typo costs no plotting
        check_output_file(Path(args.png), "the picture", PLOT_SUFFIXES)
    except UsageError as error:
        parser.exit(2, f"error: {error}\n")
    try:
        main(args.log, args.png, args.induction)
    except (OSError, KeyError, ValueError, IndexError, Gpt2NumpyError) as error:  # no such file, not a training log,
        # or a picture that cannot be written
        parser.exit(2, f"error: cannot plot {args.log} into {args.png}: {error!r}\n")
