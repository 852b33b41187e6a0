"""What the command lines share: the flags that choose a model, and loading it (downloading it first if missing)."""
import time

from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.errors import CheckpointError, UsageError, log
from gpt2_numpy.models import MODEL_SIZES, SOURCES, model_folder, models_dir_path
from gpt2_numpy.tokenizer import load_tokenizer


def add_model_args(parser):  # -> None; adds --model-size, --models-dir and --source to an argparse parser
    parser.add_argument("--model-size", choices=MODEL_SIZES, default="124M", help="which GPT-2 (124M)")
    parser.add_argument("--models-dir", metavar="DIR", help="folder of <size>/ folders ($GPT2_NUMPY_WEIGHTS, weights)")
    parser.add_argument("--source", choices=SOURCES, default="openai",
                        help="whose files to use: openai (TF checkpoint in <size>/, default) or huggingface "
                        "(safetensors in <size>-hf/)")


def load_model(args):  # -> hparams, params, tokenizer of the model add_model_args's flags name; downloaded if missing
    size, models_dir, source = args.model_size, args.models_dir, args.source
    model_dir = model_folder(size, models_dir, source)
    # download only when a file is missing: files already there are loaded as they are, so that a damaged one is
    # reported by the loader rather than silently fetched again
    if not all_present(models_dir_path(models_dir), model_dir, SOURCES[source].files):
        from gpt2_numpy.download import ensure_model  # the network stack (14 MB, 0.15 s) loads only when needed

        model_dir = ensure_model(size, models_dir, source)
    start = time.perf_counter()
    hparams, params = load_params(model_dir)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.n_vocab < hparams["n_vocab"]:  # the model could choose ids the tokenizer cannot print
        raise CheckpointError(f"{model_dir}: the model has {hparams['n_vocab']:,} tokens but its vocabulary files "
                              f"only {tokenizer.n_vocab:,}; download the model again")
    log(f"loaded GPT-2 {size} from {model_dir} in {time.perf_counter() - start:.1f} s")
    return hparams, params, tokenizer


def all_present(models_root, model_dir, names):  # -> True when every file is there; UsageError for an unusable dir
    try:
        if models_root.exists() and not models_root.is_dir():
            raise UsageError(f"the models dir {models_root} is a file: pass a folder with --models-dir or "
                             "GPT2_NUMPY_WEIGHTS")
        return all((model_dir / name).exists() for name in names)
    except OSError as error:
        raise UsageError(f"cannot read the models dir {models_root} ({error.strerror}): fix its permissions or pass "
                         "another folder with --models-dir") from None
