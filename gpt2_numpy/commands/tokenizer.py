"""`gpt2-numpy tokenizer`: train a byte-level BPE tokenizer on a text file, merge for merge as Hugging Face's trainer
does (gpt2_numpy/tokenizer_train.py), and write vocab.json + merges.txt in Hugging Face's GPT-2 layout into a folder.
stdout gets the folder (with --json, what was trained); progress goes to stderr.

    gpt2-numpy tokenizer --data FILE --vocab-size N --out DIR [--min-frequency 2] [--json]

`gpt2-numpy train --vocab-size N` trains one the same way for a model, on the training part of its text.
"""
from gpt2_numpy.commands.common import (
    ArgumentParser, path_argument, print_json, read_data, run_cli, whole_number, writing_stdout,
)
from gpt2_numpy.console import log
from gpt2_numpy.errors import UsageError
from gpt2_numpy.formats.vocabulary import FILE_NAMES
from gpt2_numpy.tokenizer_train import save_tokenizer, trained_tokenizer, train_vocabulary



def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(prog="gpt2-numpy tokenizer",
                            description="Train a byte-level BPE tokenizer (GPT-2's kind) on a UTF-8 text file, with "
                            "the same merges as Hugging Face's tokenizers, into DIR/vocab.json + DIR/merges.txt.")
    parser.add_argument("--data", required=True, type=path_argument, metavar="FILE",
                        help="the UTF-8 text to learn the merges from")
    parser.add_argument("--vocab-size", required=True, type=whole_number(257), metavar="N",
                        help="tokens in the vocabulary: the 256 bytes, N - 257 merges and <|endoftext|> (the last id)")
    parser.add_argument("--out", required=True, type=path_argument, metavar="DIR",
                        help="the folder to write vocab.json and merges.txt into (created if missing)")
    parser.add_argument("--min-frequency", type=whole_number(1), default=2, metavar="N",
                        help="merge only pairs seen at least N times (2, as Hugging Face's BpeTrainer)")
    parser.add_argument("--json", action="store_true",
                        help='print {"folder", "vocab_size", "merges", "tokens", "bytes"} as one JSON object: the '
                        "vocabulary made, and how many tokens it splits the text into")
    return parser.parse_args(argv)


def check_out(out):  # -> None, or UsageError for a folder whose tokenizer would be replaced
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: pass a folder (it is created if missing)")
    held = [name for names in FILE_NAMES.values() for name in names if (out / name).exists()]
    if held:
        raise UsageError(f"--out {out} already holds {', '.join(held)}: a model's tokenizer is not replaced under "
                         "it; choose a new folder, or delete those files first")


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    check_out(args.out)
    text = read_data(args.data)
    merges = train_vocabulary(text, args.vocab_size, args.min_frequency, args.data)
    tokens = len(trained_tokenizer(merges).encode(text))
    n_bytes = len(text.encode("utf-8"))
    save_tokenizer(args.out, merges)
    log(f"wrote a {args.vocab_size:,}-token vocabulary to {args.out}: the text is {tokens:,} tokens, "
        f"{tokens / max(n_bytes, 1):.3f} per byte")
    if args.json:
        print_json({"folder": str(args.out), "vocab_size": args.vocab_size, "merges": len(merges), "tokens": tokens,
                    "bytes": n_bytes})
        return 0
    with writing_stdout() as stdout:
        print(args.out, file=stdout)
    return 0


def main(argv=None):  # -> never returns; errors become one line on stderr and an exit status
    run_cli(run, argv)


if __name__ == "__main__":
    main()
