"""Training an SAE (model.py's math) on a stream of activations, with the machinery that trains GPT-2: AdamW
and the learning-rate schedule of optim.py, and the run folder of runs.py (its lock, its atomic saves settled after a
cut, its log), so that a run resumes exactly and never writes over what is not its own.

An SAE run's folder is an SAE folder that SAELens loads (files.py), or, for a transcoder run (transcoders.py: the
SAE's step with the MLP's output as its target), a transcoder set that circuit-tracer loads, plus:
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
from gpt2_numpy.sae.model import activation, decoder_norms, loss_and_grads
from gpt2_numpy.cores import all_cores
from gpt2_numpy.sae.fast import topk_loss_and_grads
from gpt2_numpy.sae.transcoder_files import CONFIG, layer_file, load_transcoders, save_transcoders
from gpt2_numpy.sae.files import CFG, WEIGHTS, load_sae_folder, new_sae, save_sae
from gpt2_numpy.sae.transcoders import run_order, stacked_params, transcoder_set
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
    target: Optional[str] = None  # a transcoder run's: "mlp.out" (hook then the step it reads of each layer)
    layers: Optional[list] = None  # a transcoder run's layers
    skip: bool = False  # a transcoder run's: with a linear skip connection W_skip


KEPT = ("architecture", "d_sae", "k", "l1", "lr", "batch_size", "seed", "hook", "seq_len", "buffer")
THRESHOLD_PACE = 0.1  # a topk transcoder's threshold: a moving average of the steps', over about the last 10


def init_params(settings, first_rows, layer=None):  # -> float32 params of a new SAE; first_rows: [n, d_in], the
    # targets of a first batch; layer: a transcoder's, whose draws are its own
    """W_dec's rows random directions (norm 1 for topk; 0.1 for standard, Anthropic's April 2024 init), W_enc their
    transpose, so that each latent starts by reading the direction it writes; b_enc zero; b_dec the mean of a first
    batch, so the SAE starts centred on the data (Gao et al. use the geometric median, which the mean approximates);
    a transcoder's W_skip zero, so that it starts as the SAE would."""
    rng = np.random.default_rng([settings.seed, 0, *([] if layer is None else [layer])])
    W_dec = rng.standard_normal((settings.d_sae, settings.d_in)).astype(np.float32)
    W_dec /= decoder_norms(W_dec)[:, None] / np.float32(0.1 if settings.architecture == "standard" else 1.0)
    skip = {"W_skip": np.zeros((settings.d_in, settings.d_in), np.float32)} if settings.skip else {}
    return {"W_enc": np.ascontiguousarray(W_dec.T), "b_enc": np.zeros(settings.d_sae, np.float32), "W_dec": W_dec,
            "b_dec": first_rows.mean(axis=0).astype(np.float32), **skip}


def init_transcoders(settings, first_batch):  # [n, n_layers, 2 d_in] -> stacked params of a new transcoder run
    """Each layer's as init_params's, with W_enc scaled so that the features' output on the first batch is as large as
    the target's spread: an MLP's output may be far smaller than its input (the SAE's W_enc = W_decᵀ would start the
    run with an error thousands of times the target's variance). With b_enc zero, ReLU and topk scale with W_enc."""
    layers = []
    for i, layer in enumerate(settings.layers):
        x, y = first_batch[:, i, :settings.d_in], first_batch[:, i, settings.d_in:]
        params = init_params(settings, y, layer)
        output = activation(x @ params["W_enc"], settings.architecture, settings.k) @ params["W_dec"]
        size = np.sqrt(np.mean(np.sum(output**2, axis=-1)))
        params["W_enc"] *= np.float32(np.sqrt(np.mean(np.sum((y - y.mean(axis=0)) ** 2, axis=-1))) / size if size
                                      else 1.0)
        layers.append(params)
    return {name: np.stack([params[name] for params in layers]) for name in layers[0]}


def train_step(x, params, opt_state, lr, settings, dead):  # -> (losses, stats); params, opt_state updated in place
    # one cores.all_cores() for the whole step, as training.train_step has: OpenBLAS on one thread, the pieces of the
    # step shared among the cores
    with all_cores():
        losses, grads, stats = batch_loss_and_grads(x, params, settings, dead)
        if all(math.isfinite(value) for value in losses.values()):
            adamw_step(params, grads, opt_state, lr, weight_decay=0.0)  # as SAELens's Adam: no decay toward zero
            if settings.architecture == "topk":  # the unit-norm constraint (module docstring)
                params["W_dec"] /= decoder_norms(params["W_dec"])[..., None]
    return losses, stats


def batch_loss_and_grads(batch, params, settings, dead):  # -> (losses, grads, stats) of an SAE's batch [n, d_in], or
    # of a transcoder run's [n, n_layers, 2 d_in] (each layer's input and target) with params stacked by layer: each
    # layer's transcoder on its own rows, grads stacked, losses and stats the layers' mean (fired, threshold: per
    # layer)
    if settings.target is None:
        return sae_loss_and_grads(batch, None, params, settings, dead)
    results = [sae_loss_and_grads(batch[:, i, :settings.d_in], batch[:, i, settings.d_in:],
                                  {name: value[i] for name, value in params.items()}, settings,
                                  None if dead is None else dead[i]) for i in range(batch.shape[1])]
    losses = {name: float(np.mean([result[0].get(name, 0.0) for result in results]))
              for name in dict.fromkeys(name for result in results for name in result[0])}  # in the one order
    grads = {name: np.stack([result[1][name] for result in results]) for name in params}
    stats = {name: float(np.mean([result[2][name] for result in results])) for name in ("explained_variance", "l0")}
    stats.update(fired=np.stack([result[2]["fired"] for result in results]),
                 threshold=np.array([result[2].get("threshold", 0.0) for result in results]))
    return losses, grads, stats


def sae_loss_and_grads(x, target, params, settings, dead):  # -> (losses, grads, stats) of one SAE or transcoder
    centred = settings.target is None  # an SAE takes b_dec from its input; a transcoder, as circuit-tracer's, does not
    if settings.architecture == "topk":  # the same step, from each row's k latents (fast.py)
        return topk_loss_and_grads(x, params, settings.k, dead, centred, target, batch_threshold=not centred)
    return loss_and_grads(x, params, settings.architecture, settings.k, settings.l1, dead, centred, target)


def sae_of(params, settings, model_name):  # -> the SAE the run holds
    return new_sae({"architecture": settings.architecture, "k": settings.k}, params, settings.hook, model_name)


def order_of(settings):  # -> the run's files as a save moves them in
    return SAE_ORDER if settings.target is None else run_order(settings.layers)


def save_weights(folder, params, settings, model_name, step, threshold):  # -> None: the run's SAE, or its
    # transcoder set, in folder, the weights' header naming the step
    if settings.target is None:
        save_sae(sae_of(params, settings, model_name), folder, {"step": str(step)})
    else:
        save_transcoders(transcoder_set(params, settings, threshold), folder, {"step": str(step)})


def save_sae_run(out, params, opt_state, stream, since_fired, step, seconds, settings, model_name, threshold):
    # -> None: out holds the run at step, as runs.save_run does GPT-2's: written whole into .train.save/, then moved
    # in, the weights first
    staging = out / STAGING
    staging.mkdir()
    save_weights(staging, params, settings, model_name, step, threshold)
    arrays = {f"opt/{'/'.join(map(str, key))}": np.asarray(leaf) for key, leaf in flatten(opt_state)}  # as save_run
    arrays.update(stream.state(), step=np.array(step), seconds=np.array(seconds), since_fired=since_fired,
                  settings=np.array(json.dumps(settings._asdict())))
    atomic_write(staging / STATE, lambda file: np.savez(file, **arrays))
    fsync_folder(staging)
    move_in(staging, out, order_of(settings))


def load_sae_run(out, transcoder=False):  # -> (params, threshold, state arrays, saved settings dict) of the run in
    # out (an SAE's, or a transcoder set's), checked; UsageError if not one
    if not (out / STATE).is_file():
        raise UsageError(f"--resume: {out} holds no training state ({STATE}): start the run without --resume")
    if (out / (CFG if transcoder else CONFIG)).is_file():
        raise UsageError(f"--resume: {out} holds " + ("an SAE's run: drop --transcoder" if transcoder else
                                                      "a transcoder run: add --transcoder and its --hook, --target"))
    if transcoder:
        params, threshold = stacked_params(load_transcoders(out))
    else:
        params, threshold = dict(load_sae_folder(out).params), None
    try:
        with np.load(out / STATE, allow_pickle=False) as file:
            state = dict(file)
        settings = parse_json(str(state["settings"]))
        step = int(state["step"])
        required = set(SaeSettings._fields) - SaeSettings._field_defaults.keys()
        problem = None if isinstance(settings, dict) and required <= settings.keys() else \
            "its settings are not a run's"
        for name in params:
            for moment in ("m", "v"):
                if state.get(f"opt/{moment}/{name}", np.zeros(0)).shape != params[name].shape:
                    problem = problem or f"the moment {moment}/{name} is not shaped as {name}"
        if state["since_fired"].shape != params["b_enc"].shape:
            problem = problem or "since_fired is not one count per latent"
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as error:
        problem = f"it cannot be read: {error}"
    if problem:
        raise UsageError(f"--resume: {out / STATE} is damaged ({problem}): start a new run in another folder")
    saved = read_metadata(out / (layer_file(0) if transcoder else WEIGHTS)).get("step")
    if saved != str(step):
        raise UsageError(f"--resume: {out}'s weights are from step {saved} but its {STATE} from step {step} (a save "
                         "was cut off): start a new run in another folder")
    return params, threshold, state, settings


def train_sae(out, settings, stream, params, state, model_name, threshold=None):  # -> exit status: the run in out
    # trained to settings.steps, from params (new ones: state None; else the saved run's, with its state and a topk
    # transcoder run's threshold)
    params = {name: np.array(value) for name, value in params.items()}  # copies of ours: loaded ones are views
    opt_state = adamw_state(params)
    step, since_fired = 0, np.zeros(params["b_enc"].shape, np.int64)
    threshold = np.zeros(len(settings.layers or ()), np.float32) if threshold is None else np.float32(threshold)
    order = order_of(settings)
    if state is not None:
        stream.restore(state)
        opt_state = restore_moments(opt_state, state)
        step, since_fired = int(state["step"]), state["since_fired"].astype(np.int64)
    else:
        save_sae_run(out, params, opt_state, stream, since_fired, 0, 0.0, settings, model_name, threshold)
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
                raise diverged(out, step + 1, f"the loss is {sum(losses.values()):.4g}", order)
            since_fired += len(x)
            since_fired[stats["fired"]] = 0
            step += 1
            if settings.target is not None and settings.architecture == "topk":
                threshold += (stats["threshold"] - threshold) * (1.0 if step == 1 else THRESHOLD_PACE)
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
                    raise diverged(out, step, "the weights hold NaN or infinite values", order)
                save_sae_run(out, params, opt_state, stream, since_fired, step, time.perf_counter() - started,
                             settings, model_name, threshold)
    if stop.requested and step < settings.steps:
        raise Interrupted(f"saved step {step} to {out}; continue with the same command and --resume")
    if settings.target is None:
        log(f"step {step}: saved the SAE to {out}; load it with gpt2_numpy.load_sae({str(out)!r}) or --sae {out}")
    else:
        log(f"step {step}: saved the transcoders to {out}; measure them with gpt2-numpy sae eval --transcoders {out}")
    return 0
