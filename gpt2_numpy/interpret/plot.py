"""--plot: the attention weights of one head, or of every head of a layer, as heatmaps (matplotlib, an optional extra:
plot_install names the command that installs it)."""
import math
from pathlib import Path

import numpy as np

from gpt2_numpy.model import causal_mask

PLOT_SUFFIXES = (".png", ".svg")
MAX_TICKS = 40  # tick labels per heatmap axis: a longer prompt labels every k-th token


def attention_figure(weights, heads, labels, title):  # [n_shown, n_seq, n_seq] -> matplotlib Figure
    """A heatmap of each head's weights in a grid (one head: one large map), tokens as tick labels; the masked upper
    triangle is left empty (transparent), not drawn as zeros."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    n_shown, n_seq = len(weights), weights.shape[-1]
    n_cols = math.ceil(math.sqrt(n_shown))
    n_rows = math.ceil(n_shown / n_cols)
    side = 5.5 if n_shown == 1 else 2.6  # inches per map
    figure = Figure(figsize=(side * n_cols + 1.2, side * n_rows + 0.8), layout="constrained")
    axes = figure.subplots(n_rows, n_cols, squeeze=False).ravel()
    colours = colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))
    future = np.isinf(causal_mask(n_seq))  # the mask decides what is empty: a weight that underflowed is drawn
    ticks = np.arange(0, n_seq, math.ceil(n_seq / MAX_TICKS))
    tick_labels = [plain_text(labels[i]) for i in ticks]
    font = 8 if n_shown == 1 else 6
    for index, (ax, head_weights, head) in enumerate(zip(axes, weights, heads)):
        image = ax.imshow(np.ma.masked_array(head_weights, future), cmap=colours, vmin=0, vmax=1)
        ax.set_title(f"head {head}", fontsize=font + 2)
        ax.set_xticks(ticks, tick_labels if index + n_cols >= n_shown else [], rotation=90,
                      fontsize=font)  # labelled on the bottom map of each column
        ax.set_yticks(ticks, tick_labels if index % n_cols == 0 else [], fontsize=font)
    for ax in axes[n_shown:]:
        ax.set_axis_off()
    if n_shown == 1:
        axes[0].set_xlabel("key: the token looked at")
        axes[0].set_ylabel("query: the token looking")
    figure.colorbar(image, ax=axes[:n_shown].tolist(), shrink=0.8, label="attention weight")
    figure.suptitle(title)
    return figure


def patching_figure(result, clean_labels, corrupt_labels):  # patching()'s result -> matplotlib Figure
    """--patch --plot: the recoveries as two heatmaps, per layer and head, and per layer and position (ticks: the clean
    token over the corrupt one), on one colour scale centred on 0 (white: nothing recovered; red: the clean answer)."""
    from matplotlib.figure import Figure

    heads, resid = result["heads"], result["resid"]
    n_layer, n_head = heads.shape
    n_seq = resid.shape[1]
    limit = max(1.0, float(np.max(np.abs(np.concatenate([heads.ravel(), resid.ravel()])))))
    figure = Figure(figsize=(min(4 + 0.5 * (n_head + n_seq), 18), 1.8 + 0.45 * n_layer), layout="constrained")
    axes = figure.subplots(1, 2, width_ratios=[max(n_head, 2), max(n_seq, 2)])
    ticks = np.arange(0, n_seq, math.ceil(n_seq / MAX_TICKS))
    for ax, values, title in ((axes[0], heads, "each head's attn.z"), (axes[1], resid, "resid_pre at one position")):
        image = ax.imshow(values, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_title(title, fontsize=10)
        ax.set_yticks(range(n_layer))
        ax.set_ylabel("layer")
    axes[0].set_xticks(range(n_head))
    axes[0].set_xlabel("head")
    axes[1].set_xticks(ticks, [plain_text(f"{clean_labels[i]}\n{corrupt_labels[i]}") for i in ticks], rotation=90,
                       fontsize=7)
    axes[1].set_xlabel("position: clean token over corrupt token")
    figure.colorbar(image, ax=axes.tolist(), shrink=0.9, label="recovery")
    figure.suptitle(f"Activation patching, clean into corrupt: logit difference {result['clean']:.3g} clean, "
                    f"{result['corrupt']:.3g} corrupt")
    return figure


def plot_install(package=Path(__file__).resolve().parents[1]):  # -> the command that installs matplotlib here
    # the extra exists only where the package runs from its clone (pyproject.toml beside it); an installed wheel's
    # users have no ".": for them matplotlib itself is the install
    root = package.parent
    if (root / "pyproject.toml").is_file():
        return f'pip install -e "{root}[plot]"' if root != Path.cwd() else 'pip install -e ".[plot]"'
    return "pip install matplotlib"


def plain_text(label):  # -> label as matplotlib shows it literally: a pair of "$" would start its mathtext
    return label.replace("$", r"\$")
