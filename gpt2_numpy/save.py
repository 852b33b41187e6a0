"""Writing a model folder in Hugging Face's layout, which `transformers.GPT2LMHeadModel.from_pretrained(folder)` and our
own loader (gpt2_numpy.formats.checkpoint) both read:

    model.safetensors   float32 tensors under Hugging Face's names ("transformer.h.3.mlp.c_fc.weight"); no lm_head,
                        which GPT-2 ties to wte
    config.json         GPT2Config's fields: the sizes, GPT-2's fixed choices (tanh GELU, eps 1e-5, tied head) and the
                        tokenizer's <|endoftext|> id
    vocab.json, merges.txt   the tokenizer (OpenAI's encoder.json and vocab.bpe hold the same text under other names)

Every file is written under a temporary name and then renamed over the old one, so a crash or Ctrl-C midway leaves
either the old file or the new one, never half of one.
"""
import errno
import json
import os
import stat
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path

from gpt2_numpy.params import flatten
from gpt2_numpy.errors import TokenizerError, UsageError
from gpt2_numpy.formats.safetensors import write_safetensors
from gpt2_numpy.formats.vocabulary import EOT, FILE_NAMES, read_encoder

LEAF_NAMES = {"w": "weight", "g": "weight", "b": "bias"}  # ours -> Hugging Face's (a norm's gain is its weight)


def save_model(folder, hparams, params, tokenizer_dir, metadata=None):  # -> None: folder holds a complete model
    """Write params and hparams as model.safetensors + config.json, and copy the tokenizer files from tokenizer_dir
    (either layout) as vocab.json + merges.txt; None: folder holds them already. metadata ({str: str}) goes into the
    safetensors header."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, folder)
    tensors = {hf_name(key): array for key, array in flatten(params)}
    config = hf_config(hparams, end_of_text_id(folder, hparams["n_vocab"]))
    atomic_write(folder / "config.json", lambda file: file.write(json.dumps(config, indent=2).encode()))
    # "format": "pt" tells transformers which framework's layout the tensors follow; it refuses files without it
    atomic_write(folder / "model.safetensors", lambda file: write_safetensors(file, tensors, {"format": "pt",
                                                                                             **(metadata or {})}))


def hf_name(key):  # our key path, e.g. ("blocks", 3, "mlp", "c_fc", "w") -> "transformer.h.3.mlp.c_fc.weight"
    if key in (("wte",), ("wpe",)):
        return f"transformer.{key[0]}.weight"
    *module, leaf = key
    if module[0] == "blocks":
        module = ["h", *module[1:]]
    return "transformer." + ".".join(map(str, module)) + "." + LEAF_NAMES[leaf]


def end_of_text_id(folder, n_vocab):  # -> the id of <|endoftext|> in folder's vocab.json; None: not in the model
    # the tokenizer's own: GPT-2's and ours put it last, Hugging Face's BpeTrainer first (0). A model that reads only
    # the first n_vocab ids of a larger vocabulary never produces it, so generation has no end-of-text id to stop at
    eot_id = read_encoder(folder / FILE_NAMES["Hugging Face"][0])[EOT]
    return eot_id if eot_id < n_vocab else None


def hf_config(hparams, eot_id):  # -> GPT2Config's fields for a GPT-2 of these sizes and this end-of-text id
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": hparams["n_vocab"],
        "n_positions": hparams["n_ctx"],
        "n_embd": hparams["n_embd"],
        "n_layer": hparams["n_layer"],
        "n_head": hparams["n_head"],
        "activation_function": "gelu_new",  # transformers' name for GPT-2's tanh approximation
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": eot_id,  # <|endoftext|> both starts and ends a text, as in GPT-2's training data
        "eos_token_id": eot_id,
    }


def copy_tokenizer(source_dir, folder):  # -> None: folder holds vocab.json + merges.txt, from either layout
    source_dir, folder = Path(source_dir), Path(folder)
    hf_names = FILE_NAMES["Hugging Face"]
    for names in FILE_NAMES.values():
        if (source_dir / names[0]).is_file():
            for name, hf in zip(names, hf_names):
                data = (source_dir / name).read_bytes()  # 1.5 MB in all
                atomic_write(folder / hf, lambda file: file.write(data))
            return
    raise TokenizerError(f"no vocabulary in {source_dir}: expected {' or '.join(map(' + '.join, FILE_NAMES.values()))}")


def atomic_write(path, write):  # write(binary file) -> None; path then holds exactly what write wrote, or is unchanged
    """The one atomic writer: write fills a temporary file beside path, which reaches the disk before a rename makes it
    path, so a reader never sees half a file and a failure leaves the old one whole. OSError goes to the caller."""
    path = Path(os.path.realpath(path))  # through a symlink to its file, so that the link stays a link
    # hidden, unique to this call, and short whatever the length of path's name
    handle, temporary = tempfile.mkstemp(prefix=".gpt2_numpy-", suffix=".tmp", dir=path.parent)
    try:
        with open(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the bytes reach the disk before the rename makes them the file
        os.chmod(temporary, mode_for(path))
        os.replace(temporary, path)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temporary)


def mode_for(path):  # -> the permissions of path's new version: the old file's, else an ordinary new file's
    try:
        return stat.S_IMODE(os.stat(path).st_mode)  # a file the user made private stays private
    except FileNotFoundError:
        return 0o666 & ~current_umask()  # mkstemp makes its files private; a new file is an ordinary one


@contextmanager
def made_folders(folder):  # -> the folders made for folder, innermost first; after the block, those left empty go
    # so that work which fails (or writes nothing) leaves no trace of a folder it had to make, a mistyped one above all
    made = [path for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        yield made
    finally:
        for path in made:
            with suppress(OSError):
                path.rmdir()  # only an empty folder goes


# what to do about an OSError that writing a file met, by errno
DISK_FIXES = {errno.ENOSPC: "free some disk space", errno.EDQUOT: "free some disk space",
              errno.EACCES: "fix its permissions", errno.EPERM: "fix its permissions",
              errno.EROFS: "its file system is read-only: remount it writable"}


def disk_fix(error):  # -> what to do about an OSError met writing: "free some disk space", "fix its permissions", ...
    return DISK_FIXES.get(error.errno, "fix that")


def write_problem(folder):  # -> None when a file can be made in folder; else "(permission denied): fix its
    # permissions", "(read-only file system): its file system is read-only: remount it writable", ...
    # a real file, unnamed where the system allows: os.access cannot tell a read-only file system from permissions
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        return f"({(error.strerror or str(error)).lower()}): {disk_fix(error)}"


def check_folder_path(folder, flag):  # -> None; UsageError when folder is no folder and none can be made there: a
    # file, a symbolic link to nothing, or a file on the way. Checked before any work, which would be lost
    try:
        for path in (folder, *folder.parents):
            if path.is_dir():
                return
            if path == folder and path.exists():
                raise UsageError(f"{flag} {folder} is a file: pass a folder (it is created if missing)")
            if path.exists():
                raise UsageError(f"{flag} {folder}: {path} is a file, so no folder can be made below it: choose "
                                 "another folder")
            if path.is_symlink():
                raise UsageError(f"{flag} {folder}: {path} is a symbolic link to {os.readlink(path)}, which does "
                                 "not exist: create that folder, or choose another one")
    except OSError as error:  # a folder on the way that this user may not enter
        raise UsageError(f"{flag} {folder}: cannot read the folders on its way ({error.strerror}): fix their "
                         "permissions or choose another folder") from None


def current_umask():  # -> the process's umask; reading it means setting it, so it is set straight back
    umask = os.umask(0)
    os.umask(umask)
    return umask


def fsync_folder(folder):  # -> None: the names created or renamed in folder have reached the disk
    if os.name != "posix":  # Windows cannot open a folder to flush it
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
