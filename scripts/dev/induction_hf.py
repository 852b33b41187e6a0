"""Train Hugging Face's GPT-2 (torch) on an induction text, with the recipe of `train` (the defaults are
scripts/demo/induction.sh's), and print the heads' scores: whether an induction head forms is then a fact about the
recipe, not about our trainer.

    ../refvenv/bin/python -m scripts.dev.induction_hf TEXT [--n-ctx 32] [--lr 6e-3] [--steps 10000] [--weight-decay 0.1]

TEXT: a text from scripts/demo/induction_text.py (or any). Its UTF-8 bytes are the tokens (id = the byte, 256 =
<|endoftext|>): a byte-level vocabulary of 257, as `train --vocab-size 257` makes, up to a renaming of the ids, which
changes nothing here since the probe draws its ids uniformly. As `train` does: AdamW (betas 0.9, 0.95; --weight-decay
on the matrices and embeddings), the global gradient norm clipped to 1, linear warmup then a cosine to 10% of the peak,
random windows of the first 90% of the text, no dropout. Every --eval-every steps it prints the step, the training
loss, and the best previous_token score and the best induction score of a layer-1-or-later head, on heads.csv's probe
(<|endoftext|> and 15 seeded random tokens said twice, scored by gpt2_numpy.interpret.heads). Needs torch and
transformers, in a venv of their own:
    python3 -m venv ../refvenv && ../refvenv/bin/pip install torch==2.13.0 transformers safetensors
"""
import argparse
import sys
from pathlib import Path

try:  # without the tools, --help still works and a run says in one line what to install where
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from gpt2_numpy.interpret.heads import prompt_scores, repeat_length, repeat_scores, repeated_tokens
    from gpt2_numpy.optim import BETAS, CLIP, EPS, WEIGHT_DECAY, learning_rate
    from gpt2_numpy.training import PROBE_SEED
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]
else:
    MISSING = None

EOT = 256  # the byte vocabulary's <|endoftext|>
SETUP = ("run this script in a venv with torch and transformers, made from the repo root with: python3 -m venv "
         "../refvenv && ../refvenv/bin/pip install torch==2.13.0 transformers safetensors")


def best_scores(model, probe, length):  # -> (best previous_token of any head, best induction of a layer >= 1 head)
    with torch.no_grad():
        weights = [layer[0].numpy() for layer in model(torch.tensor(probe)[None], output_attentions=True).attentions]
    previous = max(prompt_scores(layer)["previous_token"].max() for layer in weights)
    induction = max(repeat_scores(layer, length)["induction"].max() for layer in weights[1:])
    return previous, induction


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text", help="the training text (UTF-8)")
    for flag, default in (("--n-layer", 2), ("--n-head", 4), ("--n-embd", 64), ("--n-ctx", 32), ("--batch-size", 32),
                          ("--warmup", 200), ("--steps", 10000), ("--eval-every", 250), ("--seed", 0),
                          ("--threads", 1)):
        parser.add_argument(flag, type=int, default=default, help=f"({default})")
    parser.add_argument("--lr", type=float, default=6e-3, help="the peak learning rate (6e-3)")
    parser.add_argument("--weight-decay", type=float,
                        help="AdamW's decay of the matrices and embeddings (train's default, 0.1)")
    args = parser.parse_args()
    if MISSING:
        sys.exit(f"error: {MISSING} is missing from {sys.executable}: {SETUP}")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    try:
        text = Path(args.text).read_bytes()
    except OSError as error:
        sys.exit(f"error: cannot read {args.text} ({error.strerror}): pass a text file, such as one written by "
                 "python -m scripts.demo.induction_text")
    data = torch.tensor(np.frombuffer(text, dtype=np.uint8)[:int(0.9 * len(text))].astype(np.int64))
    if len(data) <= args.n_ctx:
        sys.exit(f"error: {args.text} holds {len(text):,} bytes, whose first 90% do not fill one window of "
                 f"--n-ctx {args.n_ctx}: pass a longer text")
    config = GPT2Config(vocab_size=EOT + 1, n_positions=args.n_ctx, n_embd=args.n_embd, n_layer=args.n_layer,
                        n_head=args.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=EOT, eos_token_id=EOT, attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    decay = WEIGHT_DECAY if args.weight_decay is None else args.weight_decay
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": decay},
                                   {"params": others, "weight_decay": 0.0}], lr=args.lr, betas=BETAS, eps=EPS)
    length = repeat_length(args.n_ctx)
    probe = repeated_tokens(EOT + 1, EOT, length, PROBE_SEED)
    generator = torch.Generator().manual_seed(args.seed)
    loss = float("nan")
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            previous, induction = best_scores(model, probe, length)
            print(f"step {step:5d}  loss {loss:.3f}  best previous_token {previous:.2f}  best induction (layer >= 1) "
                  f"{induction:.2f}", flush=True)
        if step == args.steps:
            break
        starts = torch.randint(0, len(data) - args.n_ctx, (args.batch_size,), generator=generator)
        windows = torch.stack([data[start:start + args.n_ctx] for start in starts])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.lr, args.warmup, args.steps)
        loss_tensor = model(windows, labels=windows).loss  # HF shifts the labels itself
        optimizer.zero_grad()
        loss_tensor.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        loss = loss_tensor.item()


if __name__ == "__main__":
    main()
