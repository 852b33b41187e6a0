"""What the command lines share: the flags that choose a model, loading it (downloading it first if missing), the
prompt and its ids, and writing to stdout. No CLI imports another; they all import this."""
import argparse
import sys
import time
from pathlib import Path

from gpt2_numpy import loading
from gpt2_numpy.allocator import keep_freed_memory
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.errors import UsageError, log, plural, writing_stdout
from gpt2_numpy.models import MODEL_SIZES, OFFICIAL_HPARAMS, SOURCES, models_dir_path
from gpt2_numpy.loading import prompt_ids  # noqa: F401 (the command lines import it from here)
from gpt2_numpy.tokenizer import load_tokenizer
from gpt2_numpy.weights import ensure_model


def whole_number(minimum):  # -> an argparse type accepting integers >= minimum
    def parse(text):
        value = int(text)  # argparse turns the ValueError into "invalid whole number value: 'x'"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def read_prompt(argument):  # -> prompt text; "-" reads stdin
    if argument != "-":
        text = argument
    elif sys.stdin is None:  # started with stdin closed (`0<&-`)
        raise UsageError('stdin is closed, and "-" reads the prompt from it: pipe the text in, or give it as an '
                         "argument")
    else:
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except OSError as error:  # e.g. `< folder`, or a descriptor open for writing only
            raise UsageError(f"cannot read the prompt from stdin ({error.strerror}): pipe the text in, or give it as "
                             "an argument") from None
        except UnicodeDecodeError as error:
            raise UsageError(f"stdin is not UTF-8 text (byte {error.start}): convert the prompt to UTF-8") from None
    try:
        text.encode("utf-8")  # undecodable command-line bytes arrive as lone surrogates
    except UnicodeEncodeError:
        raise UsageError("the prompt is not valid UTF-8 text: pass it in UTF-8, or through stdin with '-'") from None
    return text


def add_model_args(parser):  # -> None; adds --model, --model-size, --models-dir and --source to an argparse parser
    parser.add_argument("--model", metavar="DIR", type=Path,
                        help="load the model in this folder (OpenAI's or Hugging Face's layout, e.g. one written by "
                        "gpt2_numpy.train) instead of --model-size/--models-dir/--source")
    parser.add_argument("--model-size", choices=MODEL_SIZES, default="124M", help="which GPT-2 (124M)")
    parser.add_argument("--models-dir", metavar="DIR", help="folder of <size>/ folders ($GPT2_NUMPY_WEIGHTS, weights)")
    parser.add_argument("--source", choices=SOURCES, default="openai",
                        help="whose files to use: openai (TF checkpoint in <size>/, default) or huggingface "
                        "(safetensors in <size>-hf/)")


def load_model(args):  # -> hparams, params, tokenizer of the model add_model_args's flags name, verified before use
    if getattr(args, "model", None) is not None:  # callers may build args without --model
        return load_folder(args.model)
    size, models_dir, source = args.model_size, args.models_dir, args.source
    check_models_dir(models_dir_path(models_dir))
    # missing files are downloaded; files never verified are verified once (a damaged file placed by hand is refused
    # with the downloader's own error instead of generating garbage); then loading only memory-maps
    model_dir = ensure_model(size, models_dir, source)
    keep_freed_memory()  # every CLI runs forward passes next, which free and reallocate the same large arrays
    start = time.perf_counter()
    hparams, params = load_params(model_dir)
    tokenizer = load_tokenizer(model_dir)
    log(f"loaded {loaded_name(size, hparams)} from {model_dir} in {time.perf_counter() - start:.1f} s")
    return hparams, params, tokenizer


def loaded_name(size, hparams):  # -> "GPT-2 124M", or what a size's folder holds when it has another shape
    if hparams == OFFICIAL_HPARAMS[size]:
        return f"GPT-2 {size}"
    shape = ", ".join(f"{key} {value}" for key, value in hparams.items())
    other = next((f"GPT-2 {name}'s shape, " for name, official in OFFICIAL_HPARAMS.items() if official == hparams), "")
    return f"a GPT-2 of {other}{shape} (not the {size} that --model-size asked for)"


def load_folder(model_dir):  # -> hparams, params, tokenizer of the model in a folder given by --model, used as it is
    # nothing is downloaded or recorded in the user's folder
    keep_freed_memory()
    start = time.perf_counter()
    hparams, params, tokenizer = loading.load_folder(model_dir, name=f"--model {model_dir}")
    log(f"loaded a GPT-2 of {plural(hparams['n_layer'], 'layer')}, {hparams['n_embd']} wide, "
        f"{plural(hparams['n_head'], 'head')}, from {model_dir} in {time.perf_counter() - start:.1f} s")
    return hparams, params, tokenizer


def check_models_dir(models_root):  # -> None, or UsageError when the models dir is a file or cannot be read
    try:
        if models_root.exists() and not models_root.is_dir():
            raise UsageError(f"the models dir {models_root} is a file: pass a folder with --models-dir or "
                             "GPT2_NUMPY_WEIGHTS")
    except OSError as error:
        raise UsageError(f"cannot read the models dir {models_root} ({error.strerror}): fix its permissions or pass "
                         "another folder with --models-dir") from None


def write_stdout(text):  # -> None; OutputError when stdout is closed or refuses the text
    with writing_stdout() as stdout:
        stdout.write(text)
        stdout.flush()  # each token appears as soon as it is chosen, even through a pipe
