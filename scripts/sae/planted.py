"""The planted-features goal: 256 unit directions in 64 dimensions, each activation a sum of about 5 of them with
random magnitudes; an SAE trained here must find them: a decoder row at cosine >= 0.9 for >= 95% of them (topk, 512
latents, k = 6) or >= 80% (standard), within 2 minutes on 2 cores. tests/unit/sae/test_training.py runs a small version.

    python -m scripts.sae.planted --architecture topk       # stops once the goal is met, and says when
    python -m scripts.sae.planted --architecture standard
    python -m scripts.sae.planted --architecture topk --all-steps   # all 3,000 steps (or 2 minutes)
"""
import argparse
import time

import numpy as np

from gpt2_numpy.sae.model import decoder_norms
from gpt2_numpy.sae.training import WARMUP, SaeSettings, init_params, train_step
from gpt2_numpy.optim import adamw_state, learning_rate

D_IN, N_FEATURES, ACTIVE = 64, 256, 5


def planted_directions(seed, n_features=N_FEATURES, d_in=D_IN):  # -> [n_features, d_in] unit rows
    directions = np.random.default_rng([seed, 7]).standard_normal((n_features, d_in))
    return (directions / np.linalg.norm(directions, axis=1, keepdims=True)).astype(np.float32)


def planted_batch(directions, n, rng, active=ACTIVE):  # -> [n, d_in]: each row a sum of about `active` directions,
    # magnitudes 0.5 to 1.5
    active = rng.random((n, len(directions)), dtype=np.float32) < active / len(directions)
    return (active * rng.uniform(0.5, 1.5, active.shape).astype(np.float32)) @ directions


def matched(W_dec, directions, cosine=0.9):  # -> the share of directions that some decoder row matches
    rows = W_dec / decoder_norms(W_dec)[:, None]
    return float(np.mean((directions @ rows.T).max(axis=1) >= cosine))


def train_planted(architecture, steps, batch_size, lr, d_sae=512, k=6, l1=0.0, seed=0, seconds=None,
                  n_features=N_FEATURES, d_in=D_IN, active=ACTIVE, stop_at=None):
    # -> (matched share, steps taken, seconds): an SAE trained on fresh planted batches for `steps`, or `seconds`, or
    # until it matches stop_at of the directions (looked at every 50 steps)
    directions = planted_directions(seed, n_features, d_in)
    rng = np.random.default_rng([seed, 8])
    settings = SaeSettings(architecture=architecture, d_in=d_in, d_sae=d_sae, k=k if architecture == "topk" else None,
                           l1=l1, lr=lr, batch_size=batch_size, seed=seed, hook=None, source="planted",
                           data_sha256="", seq_len=None, buffer=batch_size, steps=steps, save_every=steps)
    params = init_params(settings, planted_batch(directions, batch_size, rng, active))
    opt_state, since_fired = adamw_state(params), np.zeros(d_sae, np.int64)
    start = time.perf_counter()
    for step in range(steps):
        x = planted_batch(directions, batch_size, rng, active)
        lr_now = learning_rate(step, lr, WARMUP, steps, "constant")  # the schedule of sae train
        _, stats = train_step(x, params, opt_state, lr_now, settings, since_fired >= 20 * batch_size)
        since_fired += batch_size
        since_fired[stats["fired"]] = 0
        if seconds is not None and time.perf_counter() - start > seconds:
            break
        if stop_at is not None and step % 50 == 49 and matched(params["W_dec"], directions) >= stop_at:
            break
    return matched(params["W_dec"], directions), step + 1, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", choices=("topk", "standard"), default="topk")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--l1", type=float, default=0.3)
    parser.add_argument("--seconds", type=float, default=120, help="stop after this long (120)")
    parser.add_argument("--all-steps", action="store_true", help="run every step, not only until the goal is met")
    args = parser.parse_args()
    goal = 0.95 if args.architecture == "topk" else 0.80
    share, steps, seconds = train_planted(args.architecture, args.steps, args.batch_size, args.lr, l1=args.l1,
                                         seconds=args.seconds, stop_at=None if args.all_steps else goal)
    print(f"{args.architecture}: {share:.1%} of {N_FEATURES} planted directions matched at cosine >= 0.9 after {steps} "
          f"steps of {args.batch_size} ({seconds:.0f} s); goal {goal:.0%}: {'met' if share >= goal else 'MISSED'}")


if __name__ == "__main__":
    main()
