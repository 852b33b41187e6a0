"""A model ready to use: GPT-2 by size (downloaded and verified on first use) or from a folder, as
Model(hparams, params, tokenizer), and a prompt's token ids for it. The command lines (commands/common.py) and the
text-in, text-out calls (pipeline.py) both load through here."""
from pathlib import Path
from typing import NamedTuple

from gpt2_numpy.catalog import MODEL_SIZES
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.formats.vocabulary import check_model_vocabulary
from gpt2_numpy.errors import UsageError
from gpt2_numpy.fast import inference_layout
from gpt2_numpy.tokenizer import Tokenizer, check_in_vocabulary, load_tokenizer
from gpt2_numpy.weights import ensure_model


class Model(NamedTuple):
    hparams: dict  # n_vocab, n_ctx, n_embd, n_head, n_layer
    params: dict  # nested dicts of float32 arrays, splatted into model.py's and fast.py's functions with **
    tokenizer: Tokenizer


def load_model(model="124M", models_dir=None, source="openai"):  # -> Model
    """An official GPT-2 by size ("124M", "355M", "774M" or "1558M"): missing files are downloaded into models_dir
    (default $GPT2_NUMPY_WEIGHTS, else ./weights) from source ("openai" or "huggingface"), and every file is verified
    once, as the command lines do. Anything else (a str that is no size, or any Path) is a model folder, loaded as it
    is: nothing is downloaded or written there."""
    return load_folder(model_folder(model, models_dir, source))


def model_folder(model, models_dir=None, source="openai"):  # -> Path: an official size made ready, or the folder given
    if isinstance(model, str) and model in MODEL_SIZES:
        return ensure_model(model, models_dir, source)
    return Path(model)


def load_folder(model_dir, name=None):  # -> Model; UsageError naming `name` (default: the folder) when it is unusable
    # the loaders check every file's structure and shape; only what they cannot see alone is checked here
    model_dir = Path(model_dir)
    name = name or str(model_dir)
    if not model_dir.is_dir():
        problem = "is a file" if model_dir.exists() else "does not exist"
        raise UsageError(f"{name} {problem}: pass a model folder (model.safetensors + config.json + vocab.json + "
                         f"merges.txt, or OpenAI's checkpoint files) or an official size ({', '.join(MODEL_SIZES)})")
    hparams, params = load_params(model_dir)
    tokenizer = load_tokenizer(model_dir)
    check_model_vocabulary(tokenizer.n_vocab, hparams["n_vocab"], name)
    # decoding runs faster on one weight per block stored column-major: that copy holds a quarter (124M) to a third
    # (1558M) of the weights in memory, beside the memory-mapped files
    return Model(hparams, inference_layout(params), tokenizer)


def prompt_ids(tokenizer, prompt, n_vocab, name="the prompt"):  # -> ids to feed the model, all < n_vocab
    # "<|endoftext|>" typed in a prompt is the document separator; an empty prompt starts from it, as GPT-2 was trained
    ids = tokenizer.encode(prompt, allowed_special="all") or [tokenizer.eot_id]
    return check_in_vocabulary(tokenizer, ids, n_vocab, name,
                               "use a model with GPT-2's full vocabulary, or a prompt of other words")
