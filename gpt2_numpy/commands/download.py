"""`gpt2-numpy download`: fetch an official GPT-2 into the models dir, resuming and verifying it (gpt2_numpy/loading.py
makes a folder ready, gpt2_numpy/fetch.py fetches its files). stdout gets the model folder (with --json, the folder and
its files); progress goes to stderr.

    gpt2-numpy download 124M [--models-dir DIR] [--source openai|huggingface] [--json]
"""
from gpt2_numpy.catalog import MODEL_SIZES, SOURCES
from gpt2_numpy.commands.common import (
    ArgumentParser, add_models_dir, print_json, run_cli, size_name, writing_stdout,
)
from gpt2_numpy.console import log
from gpt2_numpy.errors import UsageError
from gpt2_numpy.loading import MARKER, is_ready, ready, where


def parse_args(argv):  # -> argparse.Namespace whose size is the one model to download
    parser = ArgumentParser(prog="gpt2-numpy download", runs_model=False,
                            description="Download an official GPT-2 checkpoint, resuming and verifying it.")
    parser.add_argument("size", nargs="?", type=size_name, metavar="MODEL",
                        help=f"model size: {', '.join(MODEL_SIZES)} (in any case: 124m is 124M)")
    parser.add_argument("--model", type=size_name, metavar="SIZE", help="the model size, as the other commands name it")
    add_models_dir(parser)
    parser.add_argument("--source", default="openai", choices=SOURCES,
                        help="openai (TensorFlow checkpoint, the default) or huggingface (safetensors)")
    parser.add_argument("--json", action="store_true",
                        help='print {"folder": the model folder, "files": the names of its files} as one JSON object')
    args = parser.parse_args(argv)
    if args.size and args.model and args.size != args.model:
        raise UsageError(f"two models named: {args.size} and --model {args.model}: download one at a time")
    args.size = args.size or args.model
    if args.size is None:
        raise UsageError(f"which model? give its size, e.g. gpt2-numpy download 124M ({', '.join(MODEL_SIZES)})")
    return args


def run(argv=None):  # -> exit status; prints the model folder on stdout, everything else on stderr
    args = parse_args(argv)
    if is_ready(args.size, args.models_dir, args.source):
        folder = where(args.size, args.models_dir, args.source)
        log(f"GPT-2 {args.size} is already complete in {folder} (sizes, times and inodes as recorded when it was "
            f"verified; delete {MARKER} there to verify again)")
    folder, _ = ready(args.size, args.models_dir, args.source)
    if args.json:
        print_json({"folder": str(folder), "files": list(SOURCES[args.source].files)})
        return 0
    with writing_stdout() as stdout:  # a full or closed stdout is one error line, even unbuffered
        print(folder, file=stdout)
    return 0


def main(argv=None):  # -> never returns; errors become one line on stderr and an exit status
    run_cli(run, argv)


if __name__ == "__main__":
    main()
