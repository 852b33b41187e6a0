"""Training an SAE (model.py's math) on a stream of activations, with the machinery that trains GPT-2: AdamW
and the learning-rate schedule of optim.py, and the run folder of runs.py (its lock, its atomic saves settled after a
cut, its log), so that a run resumes exactly and never writes over what is not its own.

An SAE run's folder is an SAE folder that SAELens loads (files.py), plus:
    train_state.npz   AdamW's moments, the step, the activations each latent went without firing, the stream's
                      buffer, order and RNG, and the run's settings
    log.csv           a row per step: mse, explained_variance, l0, dead_fraction, the sparsity loss (standard's L1
                      penalty, topk's AuxK loss), lr, activations, seconds

The decoder's rows: topk keeps them at unit norm, renormalised after each step, as Gao et al. do, so that the k
largest pre-activations compare latents on one scale and the AuxK loss cannot shrink rows to ignore it. standard needs
no constraint: its L1 penalty is weighted by each row's norm, so growing a row no longer buys a smaller penalty.
"""
import json
import math
import time
import zipfile
from typing import NamedTuple, Optional

import numpy as np

from gpt2_numpy.console import log, progress_bar
from gpt2_numpy.errors import Interrupted, UsageError
from gpt2_numpy.formats import parse_json
from gpt2_numpy.formats.safetensors import read_metadata
from gpt2_numpy.sae.model import decoder_norms, loss_and_grads
from gpt2_numpy.cores import all_cores
from gpt2_numpy.sae.fast import topk_loss_and_grads
from gpt2_numpy.sae.files import CFG, WEIGHTS, load_sae_folder, new_sae, save_sae
from gpt2_numpy.optim import adamw_state, adamw_step, learning_rate
from gpt2_numpy.params import flatten
from gpt2_numpy.disk import atomic_write, fsync_folder, move_in
from gpt2_numpy.runs import STAGING, STATE, diverged, open_log, restore_moments
from gpt2_numpy.training import ctrl_c_stops

SAE_ORDER = (WEIGHTS, CFG, STATE)  # a save's files as they move in: the weights first (their header names the step)
LOG_FIELDS = ("step", "mse", "explained_variance", "l0", "dead_fraction", "sparsity_loss", "lr", "activations",
              "seconds")
DEAD_AFTER = 2**20  # a latent that has not fired in this many activations is dead (SAELens counts 1,000 steps)
WARMUP = 100  # steps of linear warmup, then --lr on: constant, as SAELens's default, so that --resume with more
# --steps continues the very run that more --steps would have been


class SaeSettings(NamedTuple):
    """An SAE run's settings, saved in train_state.npz as JSON; a resumed run keeps all but steps and save_every."""
    architecture: str  # "topk" or "standard"
    d_in: int
    d_sae: int
    k: Optional[int]  # topk's
    l1: float  # standard's L1 coefficient
    lr: float
    batch_size: int
    seed: int
    hook: Optional[str]  # the trace name read; None for an .npy file given without --hook
    source: str  # where the activations come from: the .npy file, or the model folder
    data_sha256: str  # of the text, or of the .npy file
    seq_len: Optional[int]  # tokens per window, from a model
    buffer: int  # rows in the shuffling buffer
    steps: int
    save_every: int
    model_sha256: Optional[str] = None  # of the model's weights (params_digest); runs saved before it have none


KEPT = ("architecture", "d_sae", "k", "l1", "lr", "batch_size", "seed", "hook", "seq_len", "buffer")


def init_params(settings, first_rows):  # -> float32 params of a new SAE; first_rows: [n, d_in], a first batch
    """W_dec's rows random directions (norm 1 for topk; 0.1 for standard, Anthropic's April 2024 init), W_enc their
    transpose, so that each latent starts by reading the direction it writes; b_enc zero; b_dec the mean of a first
    batch, so the SAE starts centred on the data (Gao et al. use the geometric median, which the mean approximates)."""
    rng = np.random.default_rng([settings.seed, 0])
    W_dec = rng.standard_normal((settings.d_sae, settings.d_in)).astype(np.float32)
    W_dec /= decoder_norms(W_dec)[:, None] / np.float32(0.1 if settings.architecture == "standard" else 1.0)
    return {"W_enc": np.ascontiguousarray(W_dec.T), "b_enc": np.zeros(settings.d_sae, np.float32), "W_dec": W_dec,
            "b_dec": first_rows.mean(axis=0).astype(np.float32)}


def train_step(x, params, opt_state, lr, settings, dead):  # -> (losses, stats); params, opt_state updated in place
    # one cores.all_cores() for the whole step, as training.train_step has: OpenBLAS on one thread, the pieces of the
    # step shared among the cores
    with all_cores():
        if settings.architecture == "topk":  # the same step, from each row's k latents (fast.py)
            losses, grads, stats = topk_loss_and_grads(x, params, settings.k, dead)
        else:
            losses, grads, stats = loss_and_grads(x, params, settings.architecture, settings.k, settings.l1, dead)
        if all(math.isfinite(value) for value in losses.values()):
            adamw_step(params, grads, opt_state, lr, weight_decay=0.0)  # as SAELens's Adam: no decay toward zero
            if settings.architecture == "topk":  # the unit-norm constraint (module docstring)
                params["W_dec"] /= decoder_norms(params["W_dec"])[:, None]
    return losses, stats


def sae_of(params, settings, model_name):  # -> the SAE the run holds
    return new_sae({"architecture": settings.architecture, "k": settings.k}, params, settings.hook, model_name)


def save_sae_run(out, sae, opt_state, stream, since_fired, step, seconds, settings):  # -> None: out holds the run at
    # step, as runs.save_run does GPT-2's: written whole into .train.save/, then moved in, the weights first
    staging = out / STAGING
    staging.mkdir()
    save_sae(sae, staging, {"step": str(step)})
    arrays = {f"opt/{'/'.join(map(str, key))}": np.asarray(leaf) for key, leaf in flatten(opt_state)}  # as save_run
    arrays.update(stream.state(), step=np.array(step), seconds=np.array(seconds), since_fired=since_fired,
                  settings=np.array(json.dumps(settings._asdict())))
    atomic_write(staging / STATE, lambda file: np.savez(file, **arrays))
    fsync_folder(staging)
    move_in(staging, out, SAE_ORDER)


def load_sae_run(out):  # -> (SAE, state arrays, saved settings dict) of the run in out, checked; UsageError if not one
    if not (out / STATE).is_file():
        raise UsageError(f"--resume: {out} holds no training state ({STATE}): start the run without --resume")
    sae = load_sae_folder(out)
    try:
        with np.load(out / STATE, allow_pickle=False) as file:
            state = dict(file)
        settings = parse_json(str(state["settings"]))
        step = int(state["step"])
        required = set(SaeSettings._fields) - SaeSettings._field_defaults.keys()
        problem = None if isinstance(settings, dict) and required <= settings.keys() else \
            "its settings are not a run's"
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            for moment in ("m", "v"):
                if state.get(f"opt/{moment}/{name}", np.zeros(0)).shape != sae.params[name].shape:
                    problem = problem or f"the moment {moment}/{name} is not shaped as {name}"
        if state["since_fired"].shape != (sae.d_sae,):
            problem = problem or "since_fired is not one count per latent"
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as error:
        problem = f"it cannot be read: {error}"
    if problem:
        raise UsageError(f"--resume: {out / STATE} is damaged ({problem}): start a new run in another folder")
    saved = read_metadata(out / WEIGHTS).get("step")
    if saved != str(step):
        raise UsageError(f"--resume: {out}'s weights are from step {saved} but its {STATE} from step {step} (a save "
                         "was cut off): start a new run in another folder")
    return sae, state, settings


def train_sae(out, settings, stream, sae, state, model_name):  # -> exit status: the run in out trained to
    # settings.steps, from sae (a new one: state None; else the saved run's state)
    params = {name: np.array(value) for name, value in sae.params.items()}  # copies of ours: loaded ones are views
    opt_state = adamw_state(params)
    step, since_fired = 0, np.zeros(settings.d_sae, np.int64)
    if state is not None:
        stream.restore(state)
        opt_state = restore_moments(opt_state, state)
        step, since_fired = int(state["step"]), state["since_fired"].astype(np.int64)
    else:
        save_sae_run(out, sae, opt_state, stream, since_fired, 0, 0.0, settings)
    if step >= settings.steps:
        log(f"{out} holds the SAE at step {step}; --steps {settings.steps} asks for no more")
        return 0
    log_file, writer = open_log(out, step, fields=LOG_FIELDS)
    started = time.perf_counter() - (0.0 if state is None else float(state["seconds"]))
    train_seconds, first_step = 0.0, step
    with log_file, ctrl_c_stops() as stop, progress_bar(total=settings.steps, initial=step, unit="step") as bar:
        while step < settings.steps and not stop.requested:
            step_start = time.perf_counter()
            x = stream.next()
            lr = learning_rate(step, settings.lr, WARMUP, settings.steps, "constant")
            losses, stats = train_step(x, params, opt_state, lr, settings, since_fired >= DEAD_AFTER)
            if not all(math.isfinite(value) for value in losses.values()):
                raise diverged(out, step + 1, f"the loss is {sum(losses.values()):.4g}", SAE_ORDER)
            since_fired += len(x)
            since_fired[stats["fired"]] = 0
            step += 1
            train_seconds += time.perf_counter() - step_start
            dead = float(np.mean(since_fired >= DEAD_AFTER))
            writer.writerow({"step": step, "mse": f"{losses['mse']:.6g}",
                             "explained_variance": f"{stats['explained_variance']:.6f}", "l0": f"{stats['l0']:.3f}",
                             "dead_fraction": f"{dead:.4f}",
                             "sparsity_loss": f"{losses.get('l1', losses.get('aux', 0.0)):.6g}", "lr": f"{lr:.6g}",
                             "activations": step * settings.batch_size,
                             "seconds": f"{time.perf_counter() - started:.1f}"})
            log_file.flush()
            bar.set_postfix_str(f"mse {losses['mse']:.4g}, explained {stats['explained_variance']:.3f}, "
                                f"L0 {stats['l0']:.1f}, dead {dead:.1%}, "
                                f"{(step - first_step) * settings.batch_size / train_seconds:,.0f} activations/s")
            bar.update()
            if step % settings.save_every == 0 or step == settings.steps or stop.requested:
                if not all(np.isfinite(value).all() for value in params.values()):
                    raise diverged(out, step, "the weights hold NaN or infinite values", SAE_ORDER)
                save_sae_run(out, sae_of(params, settings, model_name), opt_state, stream, since_fired, step,
                             time.perf_counter() - started, settings)
    if stop.requested and step < settings.steps:
        raise Interrupted(f"saved step {step} to {out}; continue with the same command and --resume")
    log(f"step {step}: saved the SAE to {out}; load it with gpt2_numpy.load_sae({str(out)!r}) or --sae {out}")
    return 0
