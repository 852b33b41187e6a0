"""A model ready to use, as Model(hparams, params, tokenizer): an official GPT-2 by size, or any model folder. The
command lines (commands/common.py) and the text-in, text-out calls (pipeline.py) both load through here.

    model = load_model("124M")  # or load_model("my-gpt"), a folder: loaded as it is, nothing written there

An official size's folder, told in the order it happens:
1. where it is: <models dir>/<size><source's suffix> (where), the models dir being --models-dir, else
   $GPT2_NUMPY_WEIGHTS, else ./weights; which sizes and sources exist, and their URLs: gpt2_numpy/catalog.py;
2. is it ready: its verified marker, .verified.json, still matches its files (is_ready). Then it is only read;
3. otherwise, take the folder's lock (.download.lock, through locks.py);
4. fetch the missing files into .download/ (fetch.py);
5. verify by loading: the load itself checks every tensor's CRC32C, every shape and the vocabulary, so each file is
   read once. A bad download is deleted; a bad file of the user's is named and left as it is (blame);
6. install: record the marker, and move the downloads in, the marker last.
Files placed by hand are never moved, renamed or deleted, and a Ctrl-C or a crash midway leaves everything as it was:
no final name ever holds unverified downloaded bytes.
"""
import json
import os
import shlex
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import NamedTuple

from gpt2_numpy.catalog import MODEL_SIZES, SOURCES
from gpt2_numpy.console import log
from gpt2_numpy.disk import atomic_write, disk_fix, made_folders, move_in
from gpt2_numpy.errors import CheckpointError, DownloadError, Interrupted, TokenizerError, UsageError
from gpt2_numpy.fast import block_layout
from gpt2_numpy.formats import SETTINGS_LIMIT, parse_json, read_regular, release_pages
from gpt2_numpy.formats.checkpoint import FOLDER_KINDS, folder_kind, load_params
from gpt2_numpy.locks import only_the_lock, open_lock, release_lock
from gpt2_numpy.params import flatten
from gpt2_numpy.tokenizer import Tokenizer, checked_ids, load_tokenizer

DOWNLOADS = ".download"  # subfolder holding downloads until they are verified
MARKER = ".verified.json"  # {file name: [size, mtime_ns, inode]} of a verified folder, taken before verifying
DOWNLOAD_LOCK = ".download.lock"
OTHER_FOLDER = "choose another folder with --models-dir or GPT2_NUMPY_WEIGHTS"


class Model(NamedTuple):
    hparams: dict  # n_vocab, n_ctx, n_embd, n_head, n_layer
    params: dict  # nested dicts of float32 arrays, splatted into model.py's and fast.py's functions with **
    tokenizer: Tokenizer


def load_model(model="124M", models_dir=None, source="openai", name=None):  # -> Model
    """An official GPT-2 by size ("124M", "355M", "774M" or "1558M"): missing files are downloaded into models_dir
    (default $GPT2_NUMPY_WEIGHTS, else ./weights) from source ("openai" or "huggingface"), and every file is verified
    once, as the command lines do. Anything else (a str that is no size, or any Path) is a model folder, loaded as it
    is: nothing is downloaded or written there; name (default: the folder) is what its errors call it."""
    if isinstance(model, str) and model in MODEL_SIZES:
        folder, verified = ready(model, models_dir, source)
        hparams, params, tokenizer = verified or read_model(folder)
    else:
        hparams, params, tokenizer = read_model(model, name)
    return Model(hparams, decoding_layout(params), tokenizer)


def decoding_layout(params):  # -> fast.inference_layout(params), each copied weight's mapped pages given back
    # decoding runs faster on some weights stored column-major (one per block, or all four with AVX-512 kernels): the
    # copies replace the memory-mapped originals, whose pages, read once to copy them, would otherwise stay in the
    # process's memory beside them. Block by block, so that only one block's weights are ever there twice
    blocks = []
    for block in params["blocks"]:
        blocks.append(block_layout(block))
        for (_, before), (_, after) in zip(flatten(block), flatten(blocks[-1])):
            if after is not before:
                release_pages(before)
    return {**params, "blocks": blocks}


def read_model(folder, name=None, source=None):  # -> (hparams, params, tokenizer) of a model folder
    """UsageError naming `name` (default: the folder) when it is no folder; the loaders check every file's structure
    and shape, and raise CheckpointError or TokenizerError naming the file at fault, and the files it was compared with
    (blame). source: the folder is an official one of that source, verified whole (every tensor's CRC32C too)."""
    folder = Path(folder)
    name = name or str(folder)
    if not folder.is_dir():
        problem = "is a file" if folder.exists() else "does not exist"
        raise UsageError(f"{name} {problem}: pass a model folder (model.safetensors + config.json + vocab.json + "
                         f"merges.txt, or OpenAI's checkpoint files) or an official size ({', '.join(MODEL_SIZES)})")
    if folder_kind(folder) == "sae":  # else: "no vocabulary in it, download the model there first"
        raise UsageError(f"{name} is {FOLDER_KINDS['sae']}, not a GPT-2 model: pass a model folder or an official "
                         f"size ({', '.join(MODEL_SIZES)}); an SAE goes to --sae (explain, sae features, sae eval)")
    tokenizer = load_tokenizer(folder)
    hparams, params = load_params(folder, verify=source is not None, n_tokens=tokenizer.n_vocab)
    return hparams, params, tokenizer


# -- 1. where the folder is, and 2. is it ready --

def where(size, models_dir=None, source="openai"):  # -> Path of an official size's folder
    """UsageError for an unknown size or source, or a models dir that is a file or cannot be read. A ~ in the models
    dir is the home folder."""
    checked_choice(size, MODEL_SIZES, "model size")
    checked_choice(source, tuple(SOURCES), "source")
    models_root = models_folder(models_dir)
    try:
        if models_root.exists() and not models_root.is_dir():
            raise UsageError(f"the models dir {models_root} is a file: pass a folder with --models-dir or "
                             "GPT2_NUMPY_WEIGHTS")
    except OSError as error:
        raise UsageError(f"cannot read the models dir {models_root} ({error.strerror}): fix its permissions or pass "
                         "another folder with --models-dir") from None
    return models_root / f"{size}{SOURCES[source].folder_suffix}"


def models_folder(models_dir=None):  # -> Path of the models dir: models_dir, else $GPT2_NUMPY_WEIGHTS, else ./weights
    # absolute, so that messages name the real folder, not ".../main/../models"
    return Path(models_dir or os.environ.get("GPT2_NUMPY_WEIGHTS") or "weights").expanduser().resolve()


def checked_choice(value, choices, what):  # -> value, or UsageError naming the valid choices
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return value


def is_ready(size, models_dir=None, source="openai"):  # -> True when the folder's files were verified, unchanged since
    return is_complete(where(size, models_dir, source), SOURCES[source].files)


def is_complete(folder, files):  # -> True when a past run verified these files and none has changed since
    # The marker records every file's size, modification time and inode once the files are verified, so that runs
    # after the first compare those, as git's index does, instead of re-reading gigabytes. A file rewritten in place (a
    # new time) or a folder copied elsewhere (new inodes) is verified again; delete the marker to force it.
    try:
        marker = folder / MARKER
        recorded = parse_json(read_regular(marker, SETTINGS_LIMIT))  # a named pipe or deep JSON: False, not a hang
        written = marker.stat().st_mtime_ns
        # A file whose time is not older than the marker may have changed within the same tick of the file-system
        # clock (a few ms; 2 s on FAT) after it was verified: it is verified again, as git treats "racily clean" files.
        return all(recorded[name] == stamp(folder / name) and recorded[name][1] < written for name in files)
    except (OSError, ValueError, KeyError, TypeError):  # no marker, a damaged or older one, or a file gone
        return False


def stamp(path):  # -> [size, mtime_ns, inode]: a rewrite changes the time, a copy the inode (and usually the time)
    status = path.stat()
    return [status.st_size, status.st_mtime_ns, status.st_ino]


def ready(size, models_dir=None, source="openai"):  # -> (folder, the model as verified, or None: it was ready)
    """Make GPT-2 `size` from `source` ready in the models dir: download the missing files, verify those not verified
    yet, by loading them (once: the result is recorded in the folder). Raises a Gpt2NumpyError saying what is wrong:
    CheckpointError or TokenizerError for a bad file of the user's, DownloadError for a failed download, UsageError
    for a folder that cannot be read, Interrupted for Ctrl-C."""
    folder, files = where(size, models_dir, source), SOURCES[source].files
    if is_complete(folder, files):
        return folder, None
    if not missing_files(folder, files) and not os.access(folder, os.W_OK):  # e.g. a shared, read-only copy
        log(f"verifying the files in {folder}, which is read-only, so every run verifies them again: run "
            f"`{download_command(size, folder, source)}` once with write access to record the verification")
        return folder, verified_read(folder, folder, source, fetched=())
    with locked(folder):
        if not is_complete(folder, files):
            return folder, install(folder, size, source)
        log(f"GPT-2 {size} is already complete in {folder}: another process made it ready meanwhile")
    return folder, None


def missing_files(folder, files):  # -> the names not in folder under their final names; UsageError if it cannot be read
    try:
        return [name for name in files if not (folder / name).exists()]
    except OSError as error:  # the folder or one above it cannot be searched (EACCES): no file is reachable
        raise UsageError(f"cannot read {folder} ({error.strerror}): fix the permissions of that folder and those "
                         f"above it, or {OTHER_FOLDER}") from None


def download_command(size, folder, source):  # -> the command line that makes this very folder ready
    return f"python -m gpt2_numpy.download {size} --source {source} --models-dir {shlex.quote(str(folder.parent))}"


# -- 3. the lock --

@contextmanager
def locked(folder):  # creates folder and holds its lock; a file-system error anywhere inside becomes a DownloadError.
    # The folders it made go again if the work leaves nothing in them but the lock (a first download that failed)
    lock_path = folder / DOWNLOAD_LOCK
    try:
        with made_folders(folder) as made, open_lock(lock_path, made) as lock:
            try:
                yield
            finally:
                if made and only_the_lock(lock_path):
                    with suppress(OSError):  # Windows deletes no open file: there the lock stays, harmless
                        lock_path.unlink()  # while still held: see open_lock
                release_lock(lock)
    except OSError as error:  # fetch turns requests' errors (OSErrors too) into DownloadErrors: this is the disk
        fix = disk_fix(error, other=None)
        raise DownloadError(f"cannot write {error.filename or folder}: {error.strerror or error}; "
                            f"{f'{fix} or ' if fix else ''}{OTHER_FOLDER}") from None


# -- 4. fetch what is missing, 5. verify by loading, 6. install and record --

def install(folder, size, source):  # -> the model as verified: every file present, verified and recorded in the marker
    """The missing files are fetched into <folder>/.download/ (fetch.py checks each against a SHA-256 the server
    publishes, as the Hugging Face hub does for model.safetensors), verified there together with second names (hard
    links) of the files already present, and only then moved in, the marker last. A bad download is deleted; good ones
    stay staged for the next run, and are never deleted because a file of the user's disagrees with them."""
    files = SOURCES[source].files
    missing = missing_files(folder, files)
    present = [name for name in files if name not in missing]
    staging = folder / DOWNLOADS
    staging.mkdir(exist_ok=True)
    # second names a killed run left, or downloads that the user's own files have replaced: never taken for either
    unlink_all(staging, present)
    try:
        if missing:
            log(f"downloading GPT-2 {size} from {source} into {folder}")
            from gpt2_numpy.fetch import fetch_all  # requests and tqdm are slow to import: only a download loads them

            fetch_all(folder, staging, size, source, missing)
            for name in present:  # the whole model in one folder to verify, while the user's files stay where they are
                second_name(folder / name, staging / name)
            log("verifying checksums and vocabulary")
        else:
            log(f"verifying the files already in {folder}, once: later runs only compare their sizes and times with "
                f"{MARKER}")
        # taken first: a change made while verifying shows as a changed stamp; a rename keeps a stamp
        verified = {**stamps(folder, present), **stamps(staging, missing)}
        model = verified_read(staging if missing else folder, folder, source, fetched=missing)
        atomic_write(staging / MARKER, lambda file: file.write(json.dumps(verified).encode()))
        if os.name != "posix":  # Windows renames no file that is mapped: there the model is read again once moved in
            model = None
        # the arrays of model map files, which keep them when renamed; .download/ goes, with the second names and any
        # leftover download that the user's own files replaced
        move_in(staging, folder, [*missing, MARKER])
    finally:
        unlink_all(staging, present)  # only the second names: the user's files keep their own
        with suppress(OSError):  # after a failure, keep staging only when it holds files a rerun can reuse
            staging.rmdir()
    log(f"GPT-2 {size} is ready in {folder}")
    return model


def stamps(folder, names):  # -> {name: stamp} of files in folder
    return {name: stamp(folder / name) for name in names}


def unlink_all(folder, names):  # -> None: none of names is left in folder
    for name in names:
        with suppress(FileNotFoundError):
            (folder / name).unlink()


def second_name(path, link):  # -> None: link holds path's bytes too; path itself is neither moved nor changed
    try:
        os.link(path, link)  # no byte is copied
    except OSError:  # a file system without hard links (FAT, some network shares): a copy, slower but as safe
        shutil.copyfile(path, link)


def verified_read(model_dir, folder, source, fetched):  # -> the model read, or raises once each bad download is gone
    # model_dir: where the files are read (the staging folder, or folder itself); folder: where the user finds them
    try:
        return read_model(model_dir, source=SOURCES[source])
    except (CheckpointError, TokenizerError) as error:
        compared = [Path(path).name for path in error.files if Path(path).name in SOURCES[source].files]
        blamed = blame(compared, fetched)
        deleted = [name for name in blamed if name in fetched]
        for name in deleted:  # a bad download goes; the good ones stay staged for the next run to reuse
            (model_dir / name).unlink()
        raise failed_verification(error, model_dir, folder, blamed, deleted, compared, fetched) from None
    except KeyboardInterrupt:
        raise Interrupted(f"stopped verifying the files of {folder}; none was moved, changed or deleted: run again "
                          "to verify them") from None


def blame(compared, fetched):  # -> names of the files to blame, from those a failed check compared (at fault first)
    # A download comes whole from the source (checked against a published hash where there is one): when the check
    # held it against a file of the user's, the user's file is blamed, and deleting the download would only fetch the
    # same bytes again. Downloads alone: the one at fault goes, so the next run fetches a fresh copy.
    users = [name for name in compared if name not in fetched]
    if compared and compared[0] in users:
        return compared[:1]
    return users or compared[:1]  # no file compared (an error about the folder): nothing is blamed or deleted


def failed_verification(error, model_dir, folder, blamed, deleted, compared, fetched):  # -> the error to raise
    detail = str(error).replace(str(model_dir), str(folder))  # name files where the user will look for them
    kept = [name for name in blamed if name not in deleted]
    fates = []
    if deleted:
        fates.append(f"deleted the downloaded {', '.join(deleted)}, so the next run fetches a fresh copy")
    if kept:
        against = [name for name in compared if name in fetched]
        fit = f" (it does not fit the downloaded {', '.join(against)}, kept for the next run)" if against else ""
        fates.append(f"left {', '.join(kept)} in {folder} untouched{fit}: replace the bad file with a good copy, or "
                     "delete it so the next run downloads one")
    # a bad download is a failed download (exit 1); a bad file of the user's is bad input, as the loaders say (exit 2)
    return (DownloadError if deleted else type(error))("; ".join([detail, *fates]))


# -- a prompt for the model --

def prompt_ids(tokenizer, prompt, n_vocab, name="the prompt"):  # -> ids to feed the model, all < n_vocab
    # "<|endoftext|>" typed in a prompt is the document separator; an empty prompt starts from it, as GPT-2 was trained
    return checked_ids(tokenizer, prompt, n_vocab, name, "use a model with GPT-2's full vocabulary, or a prompt of "
                       "other words", first=[tokenizer.eot_id] * (prompt == ""))
