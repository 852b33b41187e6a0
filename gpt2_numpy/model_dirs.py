"""Where an official size's files go: <models dir>/<size><source's suffix>, the models dir being --models-dir, else
$GPT2_NUMPY_WEIGHTS, else ./weights. Which sizes and sources exist: gpt2_numpy/catalog.py."""
import os
from pathlib import Path

from gpt2_numpy.catalog import MODEL_SIZES, SOURCES
from gpt2_numpy.errors import UsageError


def model_files(size, models_dir, source):  # -> (folder, names of its files); UsageError for an unknown size or source
    checked_choice(size, MODEL_SIZES, "model size")
    checked_choice(source, tuple(SOURCES), "source")
    return size_folder(size, models_dir, source), SOURCES[source].files


def models_dir_path(models_dir=None):  # -> absolute Path: the argument, else $GPT2_NUMPY_WEIGHTS, else ./weights
    chosen = models_dir or os.environ.get("GPT2_NUMPY_WEIGHTS") or "weights"
    return Path(chosen).expanduser().resolve()  # messages then name the real folder, not ".../main/../models"


def size_folder(size, models_dir=None, source="openai"):  # -> Path of one model's files; UsageError for a models dir
    # that is a file or cannot be read
    models_root = models_dir_path(models_dir)
    try:
        if models_root.exists() and not models_root.is_dir():
            raise UsageError(f"the models dir {models_root} is a file: pass a folder with --models-dir or "
                             "GPT2_NUMPY_WEIGHTS")
    except OSError as error:
        raise UsageError(f"cannot read the models dir {models_root} ({error.strerror}): fix its permissions or pass "
                         "another folder with --models-dir") from None
    return models_root / f"{size}{SOURCES[source].folder_suffix}"


def checked_choice(value, choices, what):  # -> value, or UsageError naming the valid choices
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return value


def all_there(folder, files):  # -> True when every file exists under its final name; UsageError if it cannot be read
    try:
        return all((folder / name).exists() for name in files)
    except OSError as error:  # the folder or one above it cannot be searched (EACCES): no file is reachable
        raise UsageError(f"cannot read {folder} ({error.strerror}): fix the permissions of that folder and those "
                         "above it, or choose another folder with --models-dir or GPT2_NUMPY_WEIGHTS") from None
