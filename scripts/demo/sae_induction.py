"""An SAE on the induction demo's model (scripts/demo/induction.sh): a latent that fires on the second copy of a
repeated sequence and not on the first, and what taking it out costs on each copy.

    python -m scripts.demo.sae_induction MODEL OUT [--steps N] [--d-sae N] [--k K] [--seed S]

MODEL: the folder induction.sh wrote (its texts/train.txt is what the SAE trains on); OUT: a new folder. Steps:
1. blocks.0.out, the residual stream between the two layers, over the first windows of the model's own training
   text, saved as OUT/activations.npy; `gpt2-numpy sae train --activations` a topk SAE on them.
2. A labelled text (seeded, as induction_text.py draws it): windows of n_ctx bytes packed with whole pairs, each
   character marked first copy, second copy or neither (a gap, the filler after the last pair); `gpt2-numpy sae
   eval` on it (a text the SAE never saw): the loss recovered.
3. Each latent's firing rate on second-copy bytes and on first-copy bytes; the --candidates latents with the largest
   difference.
4. Each candidate taken out in turn (features.ablation_edit: x - f(x) W_dec[F], the SAE's error kept) in every
   window: the rise of the mean next-token loss on the bytes of second copies and of first copies; the same for a
   control, the latent that fires most often among the rest. The chosen latent: the candidate whose loss rise on
   second copies exceeds its rise on first copies most (not every selective latent is one the model uses).
5. `gpt2-numpy sae features` writes OUT/features.html for the chosen latent, three other candidates and the control.
Prints the numbers and writes them to OUT/numbers.json; --screenshot PNG also draws the page's first latent (with
selenium and Debian's chromium chromium-driver, as scripts/demo/screenshot_page.py).
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpt2_numpy import load_model
from gpt2_numpy.sae.features import ablation_edit, latent_activations
from gpt2_numpy.interpret.tracing import log_softmax, trace
from gpt2_numpy.interpret.edits import run_with_edits
from gpt2_numpy.sae import load_sae
from scripts.demo.induction_text import GAPS, LENGTHS, random_chars

HOOK = "blocks.0.out"  # the residual stream between the two layers: what the induction head's keys read
NEITHER, FIRST, SECOND = 0, 1, 2


def labelled_windows(n_windows, n_ctx, seed):  # -> (bytes [n_windows, n_ctx] uint8, labels [n_windows, n_ctx])
    """Windows of whole pairs (sequence, gap, sequence), as induction_text draws them, at least one each, each window
    filled up with random characters after its last whole pair; every byte labelled FIRST, SECOND or NEITHER."""
    rng = np.random.default_rng(seed)
    windows, labels = [], []
    while len(windows) < n_windows:
        data, marks = b"", []
        while True:
            sequence = random_chars(rng, rng.integers(LENGTHS[0], LENGTHS[1] + 1)).encode()
            gap = random_chars(rng, rng.integers(GAPS[0], GAPS[1] + 1)).encode()
            pair = sequence + gap + sequence
            if len(data) + len(pair) > n_ctx and data:
                break
            if len(data) + len(pair) > n_ctx:  # a pair too long for a window of its own: drawn again
                continue
            data += pair
            marks += [FIRST] * len(sequence) + [NEITHER] * len(gap) + [SECOND] * len(sequence)
        filler = random_chars(rng, n_ctx).encode()[: n_ctx - len(data)]
        data += filler.decode("utf-8", "ignore").encode()  # whole characters only
        data += b" " * (n_ctx - len(data))
        windows.append(np.frombuffer(data, np.uint8))
        labels.append(marks + [NEITHER] * (n_ctx - len(marks)))
    return np.array(windows), np.array(labels)


def fail(message):  # -> never returns: one error line, status 2
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def cli(*args):  # -> stdout of `python -m gpt2_numpy ARGS`; stops the demo when the command fails
    result = subprocess.run([sys.executable, "-m", "gpt2_numpy", *map(str, args)], stdout=subprocess.PIPE, text=True)
    if result.returncode:
        print(f"error: gpt2-numpy {' '.join(map(str, args))} failed with status {result.returncode}", file=sys.stderr)
        sys.exit(result.returncode)
    return result.stdout


def token_losses(logits, ids):  # [n_seq, n_vocab], int [n_seq] -> [n_seq - 1]: -log p(ids[i + 1]) at position i
    return -np.take_along_axis(log_softmax(logits[:-1]), np.asarray(ids[1:])[:, None], -1)[:, 0]


def copy_losses(windows, labels, params, n_head, edits):  # -> {"first", "second"}: mean loss on each copy's bytes
    losses = np.stack([token_losses(run_with_edits(w, params, n_head, edits)["logits"] if edits
                                    else trace(w, params, n_head)["logits"], w) for w in windows])
    targets = labels[:, 1:]  # the loss at i is the loss of byte i + 1
    return {"first": float(losses[targets == FIRST].mean()), "second": float(losses[targets == SECOND].mean())}


def screenshot(page, png, size="1100,620"):  # -> None; the page opened offline in headless Chromium, saved as PNG
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={size}",
                     "--proxy-server=127.0.0.1:9"]:  # nothing gets out: the page must need nothing
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        driver.get(Path(page).resolve().as_uri())
        driver.save_screenshot(str(png))
    finally:
        driver.quit()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--windows", type=int, default=512, help="labelled windows to measure on")
    parser.add_argument("--candidates", type=int, default=8,
                        help="the latents most selective for second copies, each taken out in turn")
    parser.add_argument("--screenshot", type=Path, metavar="PNG", help="also draw the page's first latent here")
    parser.add_argument("--train-windows", type=int, default=8192, help="windows of train.txt to train the SAE on")
    args = parser.parse_args()
    if not (args.model / "texts/train.txt").is_file():
        fail(f"{args.model} holds no texts/train.txt: pass the folder scripts/demo/induction.sh wrote")
    if args.out.exists():
        fail(f"{args.out} exists: pass an OUT that does not exist yet")
    args.out.mkdir(parents=True)
    sae_dir = args.out / "sae"
    hparams, params, tokenizer = load_model(args.model)
    n_head, n_ctx = hparams["n_head"], hparams["n_ctx"]
    # the activations, computed here a batch of windows at a time (sae train --data reads them window by window)
    tokens = tokenizer.encode((args.model / "texts/train.txt").read_text(encoding="utf-8"))
    train_windows = np.array(tokens[: args.train_windows * n_ctx]).reshape(-1, n_ctx)
    first_block = {**params, "blocks": params["blocks"][:1]}  # blocks.0.out needs block 0 alone
    activations = np.concatenate([trace(batch, first_block, n_head)[HOOK].reshape(-1, hparams["n_embd"])
                                  for batch in np.array_split(train_windows, max(1, len(train_windows) // 512))])
    np.save(args.out / "activations.npy", activations)
    cli("sae", "train", "--activations", args.out / "activations.npy", "--hook", HOOK, "--out", sae_dir,
        "--architecture", "topk", "--d-sae", args.d_sae, "--k", args.k, "--steps", args.steps,
        "--batch-size", 1024, "--lr", 1e-3, "--seed", args.seed)

    windows, labels = labelled_windows(args.windows, n_ctx, seed=2)  # seeds 0 and 1 are induction.sh's texts
    text_path = args.out / "labelled.txt"
    text_path.write_bytes(windows.tobytes())  # each window n_ctx bytes: sae features' --seq-len cuts them back apart
    numbers = {"eval": json.loads(cli("sae", "eval", "--sae", sae_dir, "--model", args.model, "--data", text_path,
                                      "--seq-len", n_ctx, "--json"))}

    sae = load_sae(sae_dir)
    # a byte-level model: a token per byte (its ids in GPT-2's byte order, not the byte's value)
    ids = np.array([tokenizer.encode(window.tobytes().decode("utf-8")) for window in windows])
    assert ids.shape == windows.shape, "the model's tokenizer is not byte-level: use induction.sh's model"
    fired = np.stack([latent_activations(w, params, n_head, sae) > 0 for w in ids])  # [n_windows, n_ctx, d_sae]
    first, second = fired[labels == FIRST].mean(axis=0), fired[labels == SECOND].mean(axis=0)
    candidates = [int(latent) for latent in np.argsort(-(second - first), kind="stable")[: args.candidates]]
    rest = fired.mean(axis=(0, 1))
    rest[candidates] = -1
    control = int(np.argmax(rest))  # the latent that fires most often, among the others
    clean = copy_losses(ids, labels, params, n_head, [])
    numbers["loss_clean"] = clean
    numbers["latents"] = []
    for latent in [*candidates, control]:
        ablated = copy_losses(ids, labels, params, n_head, [ablation_edit(sae, [latent])])
        numbers["latents"].append({"id": latent, "control": latent == control,
                                   "fires_on_second": float(second[latent]), "fires_on_first": float(first[latent]),
                                   "loss_rise_second": ablated["second"] - clean["second"],
                                   "loss_rise_first": ablated["first"] - clean["first"]})
    chosen = max(numbers["latents"][:-1], key=lambda row: row["loss_rise_second"] - row["loss_rise_first"])
    numbers["chosen"] = latent = chosen["id"]
    (args.out / "numbers.json").write_text(json.dumps(numbers, indent=1) + "\n")

    cli("sae", "features", "--sae", sae_dir, "--model", args.model, "--data", text_path, "--seq-len", n_ctx,
        "--html", args.out / "features.html", "--latents", latent, *[c for c in candidates if c != latent][:3], control,
        "--contexts", 8)
    if args.screenshot:
        screenshot(args.out / "features.html", args.screenshot)
    print(f"{numbers['eval']['tokens']:,} tokens: loss recovered {numbers['eval']['loss_recovered']:.3f} (L_clean "
          f"{numbers['eval']['L_clean']:.3f}, L_sae {numbers['eval']['L_sae']:.3f}, L_zero "
          f"{numbers['eval']['L_zero']:.3f}); explained variance {numbers['eval']['explained_variance']:.3f}, "
          f"L0 {numbers['eval']['l0']:.1f}")
    print(f"loss on first copies {clean['first']:.3f}, on second copies {clean['second']:.3f} nats per byte; each "
          "latent taken out:")
    print("| latent | fires on second copies | on first copies | loss rise, second copies | first copies |")
    print("|---|---|---|---|---|")
    for row in numbers["latents"]:
        name = f"{row['id']}" + " (control: fires most often)" * row["control"] + " **chosen**" * (row["id"] == latent)
        print(f"| {name} | {row['fires_on_second']:.1%} | {row['fires_on_first']:.1%} | "
              f"{row['loss_rise_second']:+.4f} | {row['loss_rise_first']:+.4f} |")

if __name__ == "__main__":
    main()
