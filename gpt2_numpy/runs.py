"""A training run's folder, kept resumable whatever happens: its saves, its lock, its log, and the checks that a
folder holds a run that --resume can continue. The loop that fills it is gpt2_numpy/training.py.

A run's folder is a model folder in Hugging Face's layout (gpt2_numpy/save.py), which every command loads with
`--model DIR` and `transformers.GPT2LMHeadModel.from_pretrained(DIR)` reads, plus:
    train_state.npz   what --resume needs besides the weights: AdamW's moments, the step, the data order and position,
                      the RNG state and the run's settings; and the thread count it ran at, which --resume compares
                      (a product split among another number of threads rounds otherwise)
    log.csv           one row per step: step, train_loss, val_loss and val_bits_per_byte (at evaluations), lr,
                      grad_norm (before clipping), tokens, seconds (spent in training steps, across resumes);
                      written as the run goes, so --resume drops the rows after its save
    heads.csv         at each evaluation, a row per head: step, layer, head and the five scores of `explain --heads`
                      (gpt2_numpy/interpret/heads.py) on a fixed repeated probe; kept as log.csv is
    .train.lock       locked for the whole run, as downloads lock their folder: a second run into it stops at once

A save is one unit, so that whatever cuts it off (a full disk, a second Ctrl-C, a kill) the folder holds one whole
save, and the weights `--model OUT` loads are always those --resume continues from. It is written whole into
OUT/.train.save/ (model.safetensors, whose header names the step, config.json, the tokenizer files, and
train_state.npz last), every file and the folder flushed to the disk. Then its files take their places in OUT, the
weights first: that one rename is the moment the save happens. A save cut off midway is settled by the next run, under
the lock, or on the spot: if the weights in OUT name its step, the rest of it moves in; otherwise .train.save/ goes
and the save before it stays, whole. So the folder needs room for two saves at once: the one in place and the next.
"""
import csv
import io
import json
import math
import shutil
import zipfile
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

from gpt2_numpy.cores import threads
from gpt2_numpy.formats.checkpoint import FOLDER_KINDS, folder_kind, load_params
from gpt2_numpy.errors import Gpt2NumpyError, Interrupted, TrainingFailed, UsageError
from gpt2_numpy.formats import parse_json
from gpt2_numpy.formats.safetensors import read_metadata
from gpt2_numpy.interpret.heads import PATTERNS
from gpt2_numpy.params import flatten
from gpt2_numpy.disk import atomic_write, check_folder_path, disk_fix, fsync_folder, move_in
from gpt2_numpy.save import save_model
from gpt2_numpy.formats.vocabulary import FILE_NAMES
from gpt2_numpy.locks import release_lock, take_lock
from gpt2_numpy.optim import WEIGHT_DECAY

STATE = "train_state.npz"
LOG = "log.csv"
HEADS = "heads.csv"
# each log's columns
LOGS = {LOG: ("step", "train_loss", "val_loss", "val_bits_per_byte", "lr", "grad_norm", "tokens", "seconds"),
        HEADS: ("step", "layer", "head", *PATTERNS)}
MODEL = "model.safetensors"
STAGING = ".train.save"  # the next save, written whole here before its files take their places in --out
LOCK = ".train.lock"
# the order in which a save's files take their places: the weights first (their header names the step, so that rename
# is the save), the state last (while .train.save/ holds it, the save has not all moved in)
SAVE_ORDER = (MODEL, "config.json", *FILE_NAMES["Hugging Face"], STATE)


class Settings(NamedTuple):
    """A run's settings, saved in train_state.npz as JSON. A resumed run keeps them all but steps, eval_every and
    save_every."""
    batch_size: int
    seq_len: int
    lr: float
    warmup: int
    schedule: str  # "cosine" or "constant"
    val_fraction: float
    seed: int
    eval_batches: int
    steps: int  # these three may change when the run resumes
    eval_every: int
    save_every: int
    data_sha256: str  # of the text trained on
    init: Optional[str]  # the official size or model folder fine-tuned; None from scratch
    vocab_size: Optional[int] = None  # the run's own tokenizer's size (--vocab-size); None for its model's
    min_frequency: Optional[int] = None
    weight_decay: float = WEIGHT_DECAY  # AdamW's decoupled decay of the matrices and embeddings (a run saved before
    # the flag existed used this)

    @classmethod
    def saved(cls, values, **changes):  # -> Settings from a saved run's JSON object (load_run checked it), changed
        # an older run saved no vocab_size or min_frequency: they stay None
        return cls(**{**{name: values[name] for name in cls._fields if name in values}, **changes})


class Run(NamedTuple):
    """A training run: its folder, its model's shape, its settings, and write_tokenizer(folder), which puts the run's
    tokenizer files in a save."""
    out: Path
    hparams: dict
    settings: Settings
    write_tokenizer: Callable[[Path], None]


def save_run(run, params, opt_state, batches, step, seconds):  # -> None: run.out holds the run at step, resumable
    # (see the module docstring); cut off, it is settled by settle()
    out = run.out
    staging = out / STAGING
    staging.mkdir()  # none is left: settle() ran when the run took the lock, and a failed save ends the run
    run.write_tokenizer(staging)
    save_model(staging, run.hparams, params, None, metadata={"step": str(step)})
    arrays = {f"opt/{'/'.join(map(str, key))}": np.asarray(leaf) for key, leaf in flatten(opt_state)}
    arrays.update(batches.state(), step=np.array(step), seconds=np.array(seconds), threads=np.array(threads()),
                  settings=np.array(json.dumps(run.settings._asdict())))
    atomic_write(staging / STATE, lambda file: np.savez(file, **arrays))  # last: with it, the save is whole
    fsync_folder(staging)
    move_in(staging, out, SAVE_ORDER)


def settle(out, order=SAVE_ORDER):  # -> None: a save cut off midway (a full disk, a second Ctrl-C, a kill) made whole,
    # or dropped; order: the save's files, the weights (whose header names the step) first, the state last (an SAE
    # run's are sae/training.py's)
    staging = out / STAGING
    if not staging.exists():
        return
    if (staging / STATE).is_file():
        staged = staged_step(staging / STATE)
        if staged is not None and saved_step(out, order[0]) == staged:  # its weights are in place: the save
            move_in(staging, out, order)  # happened, the rest of it moves in
            return
    shutil.rmtree(staging)  # never began to move in (or was never whole): the save in place stays


def staged_step(path):  # -> the step a staged train_state.npz records (str); None for one that cannot be read, which
    # no save of ours moved in (np.load's ValueError for text; BadZipFile, EOFError or zlib.error for a damaged file)
    try:
        with np.load(path) as state:
            return str(int(state["step"]))
    except (ValueError, KeyError, TypeError, OverflowError, EOFError, zipfile.BadZipFile, zlib.error):
        return None


def saved_step(out, weights=MODEL):  # -> the step of the save in out (str), as its weights' header names it; None
    # before the first
    return read_metadata(out / weights).get("step") if (out / weights).is_file() else None


def kept(out, order=SAVE_ORDER):  # -> (the step of out's last save, None if there is none; the words that say which
    # save out keeps)
    try:
        saved = saved_step(out, order[0])
    except (OSError, Gpt2NumpyError):  # out cannot be read either
        return None, f"{out} stays as it was"
    return saved, "nothing was saved" if saved is None else f"the last save (step {saved}) is kept"


def cannot_write(out, error, order=SAVE_ORDER):  # -> TrainingFailed for an OSError writing out: what to do, and which
    # save stays
    saved, keeps = kept(out, order)
    then = "then continue with the same command and --resume" if saved else "or choose another --out"
    return TrainingFailed(f"cannot write to {out} ({error.strerror or error}): {disk_fix(error)}, {then}; {keeps}")


def diverged(out, step, what, order=SAVE_ORDER):  # -> TrainingFailed for a run whose numbers are no longer finite
    return TrainingFailed(f"step {step}: {what}: training diverged; {kept(out, order)[1]}; start again in another "
                          "--out with a lower --lr" + (" or a longer --warmup" if order == SAVE_ORDER else ""))


def check_out(out, resume, kind=None):  # -> True when out holds a run of ours, to be claimed (and judged there)
    # before anything else; False when it is empty or missing; UsageError when this run cannot write there
    # A run of ours is a folder holding train_state.npz: only a save writes it, beside the weights of its step. Any
    # other folder with files in it is someone else's (a model, an OpenAI checkpoint, notes), never written over. Our
    # lock file does not count, and a save cut off midway (.train.save/) makes the folder ours. kind: what this run
    # writes, "model" (train) or "sae" (sae train): a folder of the other kind is named as such, run or not; None:
    # not looked at (claimed's second look)
    check_folder_path(out, "--out")
    try:
        names = sorted(path.name for path in out.iterdir() if path.name != LOCK) if out.is_dir() else []
    except OSError as error:
        raise UsageError(f"cannot read --out {out} ({error.strerror or error}): fix its permissions or choose another "
                         "folder") from None
    found = folder_kind(out) if names and kind else None
    if found not in (None, kind):
        other = {"model": "train", "sae": "sae train"}
        saved = f"; the run saved there continues with gpt2-numpy {other[found]} --resume" * (STATE in names)
        raise UsageError(f"--out {out} is {FOLDER_KINDS[found]}, and {other[kind]} writes "
                         f"{FOLDER_KINDS[kind].partition(' (')[0]}: give --out a new or empty folder{saved}")
    if STATE in names or STAGING in names:
        return True
    if resume:
        raise UsageError(f"--resume: {out} holds no training state ({STATE}): start the run without --resume")
    if names:
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3:,} more" if len(names) > 3 else "")
        raise UsageError(f"--out {out} holds files that are not a training run ({listed}): choose an empty or new "
                         "folder, so that nothing in it is written over; to continue a run, give its folder and "
                         "--resume")
    return False


@contextmanager
def claimed(out, resume, order=SAVE_ORDER):  # -> None while this process holds out's lock, out settled (see settle)
    # and checked again
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = (out / LOCK).open("a")  # the file stays after the run, as the download lock does (see loading.locked)
    except OSError as error:
        raise cannot_write(out, error, order) from None
    with lock:
        if not take_lock(lock, out, "training", wait=False):
            raise UsageError(f"another training run holds {out} (it has locked {LOCK}): wait for it to end, or choose "
                             "another --out")
        try:
            with settled_if_cut(out, order):
                settle(out, order)
            if check_out(out, resume) and not resume:  # looked at again, settled: another run may have saved here
                raise UsageError(f"--out {out} already holds a training run: add --resume to continue it, or choose "
                                 "another folder")
            yield
        finally:
            release_lock(lock)


@contextmanager
def settled_if_cut(out, order=SAVE_ORDER):  # -> context in which a save may be cut off: a disk error or a second
    # Ctrl-C stops the run
    # with one line, out settled as the next run would find it; out's lock must be held
    try:
        yield
    except OSError as error:  # --out's disk: stderr cannot be the cause, as the progress bar and log() fail quietly
        with suppress(OSError):
            settle(out, order)  # drops a save cut off while written (freeing its space), or moves in one cut off
        raise cannot_write(out, error, order) from None  # moving in
    except KeyboardInterrupt:  # a second Ctrl-C
        settle(out, order)
        saved, keeps = kept(out, order)
        raise Interrupted(f"stopped at once; {keeps}" + ("; continue with the same command and --resume" if saved
                                                         else "")) from None


def load_run(out):  # -> (hparams, params, state arrays) of the run saved in out, all checked; UsageError if none
    # every check of a resumed run is here, before anything is written: what comes later trusts the state
    if not (out / STATE).is_file():
        raise UsageError(f"--resume: {out} holds no training state ({STATE}): start the run without --resume")
    hparams, params = load_params(out)  # CheckpointError names what is wrong with the weights
    try:
        with np.load(out / STATE, allow_pickle=False) as file:
            state = dict(file)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        raise damaged_state(out, f"it cannot be read: {error}") from None
    problem = state_problem(state, params)
    if problem:
        raise damaged_state(out, problem)
    model_step = read_metadata(out / "model.safetensors").get("step")
    if model_step != str(int(state["step"])):
        raise UsageError(f"--resume: {out}'s weights are from step {model_step} but its {STATE} from step "
                         f"{int(state['step'])} (a save was cut off): start a new run in another folder")
    for name in LOGS:  # their rows' steps, checked now; open_log keeps the rows up to the saved step
        read_log(out / name)
    return hparams, params, state


def damaged_state(out, problem):  # -> UsageError for a train_state.npz that cannot be resumed
    return UsageError(f"--resume: {out / STATE} is damaged ({problem}): start a new run in another folder (--init "
                      f"{out} starts it from the saved weights)")


MISSING = object()  # a saved setting absent, with no default
SCALARS = {"step": "iu", "opt/step": "iu", "data_position": "iu", "seconds": "fiu", "settings": "U", "data_rng": "U"}
SETTING_CHECKS = {  # a saved setting -> is its value one that the flags could have given
    **dict.fromkeys(("batch_size", "seq_len", "eval_batches"), lambda value: type(value) is int and value >= 1),
    **dict.fromkeys(("seed", "warmup", "steps"), lambda value: type(value) is int and value >= 0),
    "lr": lambda value: type(value) in (int, float) and 0 < value < math.inf,
    "weight_decay": lambda value: type(value) in (int, float) and 0 <= value < math.inf,
    "val_fraction": lambda value: type(value) in (int, float) and 0 < value < 1,
    "schedule": lambda value: value in ("cosine", "constant"),
    "data_sha256": lambda value: isinstance(value, str),
    "init": lambda value: value is None or isinstance(value, str),
}


def state_problem(state, params):  # -> what makes train_state.npz's arrays unfit to resume these params, or None
    missing = next((name for name in (*SCALARS, "data_order") if name not in state), None)
    if missing:
        return f"no {missing}"
    for name, kinds in SCALARS.items():
        if state[name].shape != () or state[name].dtype.kind not in kinds:
            return f"{name} is not a single {'text' if kinds == 'U' else 'number'}"
    if "threads" in state and (state["threads"].shape != () or state["threads"].dtype.kind not in "iu" or
                               int(state["threads"]) < 1):  # a run saved before the count was recorded has none
        return "threads is not a single count of threads"
    step, order, position = int(state["step"]), state["data_order"], int(state["data_position"])
    if step < 0 or int(state["opt/step"]) != step:
        return f"step {step}, AdamW's step {int(state['opt/step'])}"
    try:
        settings = parse_json(str(state["settings"]))
        np.random.PCG64().state = parse_json(str(state["data_rng"]))  # what Batches.restore sets: PCG64's state
    except (ValueError, TypeError, KeyError, OverflowError) as error:
        return f"its settings or data_rng are not what was saved: {error}"
    if not isinstance(settings, dict):
        return "its settings are not a JSON object"
    # a setting newer than the run (weight_decay) is its default; any other missing one is damage
    wrong = next((name for name, check in SETTING_CHECKS.items()
                  if not check(settings.get(name, Settings._field_defaults.get(name, MISSING)))), None)
    if wrong:
        return f"the setting {wrong} is {settings.get(wrong, 'missing')!r}"
    if order.ndim != 1 or order.dtype.kind not in "iu" or not np.array_equal(np.sort(order), np.arange(len(order))):
        return "data_order is not an order of the data's windows"
    if not 0 <= position <= len(order):
        return f"data_position {position} is outside the order of {len(order):,} windows"
    for key, param in flatten(params):
        for moment in ("m", "v"):
            name = f"opt/{moment}/{'/'.join(map(str, key))}"
            if name not in state or state[name].shape != param.shape or state[name].dtype.kind != "f":
                found = state[name].shape if name in state else "missing"
                return f"the moment {name} should be {param.shape} floats, found {found}"
    return None


def restore_moments(template, state):  # -> optimizer state shaped like template, its leaves from state's "opt/" arrays
    def fill(node, prefix):
        if isinstance(node, dict):
            return {key: fill(value, prefix + (key,)) for key, value in node.items()}
        if isinstance(node, list):
            return [fill(value, prefix + (index,)) for index, value in enumerate(node)]
        saved = state[f"opt/{'/'.join(map(str, prefix))}"]
        return saved if isinstance(node, np.ndarray) else type(node)(saved)

    return fill(template, ())


def read_log(path, fields=None):  # -> the rows of a log (log.csv, heads.csv), none if it is missing; UsageError for a
    # row open_log could not write back; fields: its columns (LOGS's, by its name, by default)
    if not path.is_file():
        return []
    try:
        with path.open(newline="", encoding="utf-8") as file:
            text = file.read()
        last = text[text.rfind("\n") + 1:]  # a last line with no line end: cut off as it was written, or edited
        if last and len(next(csv.reader([last]))) < len(next(csv.reader([text.split("\n", 1)[0].rstrip("\r")]))):
            # cut off (a full disk, a kill), maybe inside its step: that step came after the last save, since a run
            # saves a step only once its row is written, so the row goes and --resume writes it again
            text = text[:-len(last)]
        reader, rows = csv.DictReader(io.StringIO(text, newline=""), restval=None), []
        unknown = [name for name in reader.fieldnames or () if name not in (fields or LOGS[path.name])]
        if unknown:
            raise UsageError(f"--resume: the header of {path} has the column {unknown[0]!r}, which a run does not "
                             "write: remove that column (or delete the file: the run resumes, its earlier rows are "
                             "lost)")
        for row in reader:
            if None in row:  # csv.DictReader's key for the fields past the header's
                raise UsageError(f"--resume: line {reader.line_num} of {path} has more fields than its header: "
                                 "correct that line (or delete it)")
            if None in row.values():  # its restval, for the fields short of the header's
                raise UsageError(f"--resume: line {reader.line_num} of {path} has fewer fields than its header: "
                                 "correct that line (or delete it)")
            if not str(row.get("step")).isdecimal():
                raise UsageError(f"--resume: line {reader.line_num} of {path} has the step {row.get('step')!r}, "
                                 "not a whole number: correct that line (or delete it)")
            rows.append(row)
    except (UnicodeDecodeError, csv.Error) as error:
        raise UsageError(f"--resume: {path} is not a CSV log ({error}): delete it (the run resumes, its earlier "
                         "rows are lost)") from None
    return rows


def open_log(out, step, name=LOG, fields=None):  # -> file, csv writer appending to out/name (a log of LOGS, or one of
    # these fields), which keeps only the rows up to step
    path, fields = out / name, fields or LOGS[name]
    rows = [row for row in read_log(path, fields) if int(row["step"]) <= step] if step else []
    text = io.StringIO()
    writer = csv.DictWriter(text, fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda file: file.write(text.getvalue().encode()))
    file = path.open("a", newline="")
    return file, csv.DictWriter(file, fields)
