"""`gpt2-numpy tokenizer`: train a byte-level BPE tokenizer on a text file, merge for merge as Hugging Face's trainer
does (gpt2_numpy/tokenizer_train.py), and write vocab.json + merges.txt in Hugging Face's GPT-2 layout into a folder.
stdout gets the folder (with --json, what was trained); progress goes to stderr.

    gpt2-numpy tokenizer --data FILE --vocab-size N --out DIR [--min-frequency 2] [--json]

`gpt2-numpy train --vocab-size N` trains one the same way for a model, on the training part of its text.
"""
import os
import shutil
import tempfile
from contextlib import suppress
from pathlib import Path

from gpt2_numpy.commands.common import (
    ArgumentParser, check_writable, path_argument, print_json, read_data, run_cli, whole_number, writing_stdout,
)
from gpt2_numpy.console import log
from gpt2_numpy.errors import UsageError
from gpt2_numpy.formats.vocabulary import FILE_NAMES
from gpt2_numpy.disk import check_folder_path, disk_fix, fsync_folder, made_folders
from gpt2_numpy.tokenizer_train import save_tokenizer, trained_tokenizer, train_vocabulary


def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(prog="gpt2-numpy tokenizer", runs_model=False,
                            description="Train a byte-level BPE tokenizer (GPT-2's kind) on a UTF-8 text file, with "
                            "the same merges as Hugging Face's tokenizers trained on the whole text at once, into "
                            "DIR/vocab.json + DIR/merges.txt.")
    parser.add_argument("--data", required=True, type=path_argument, metavar="FILE",
                        help="the UTF-8 text to learn the merges from")
    parser.add_argument("--vocab-size", required=True, type=whole_number(257), metavar="N",
                        help="tokens in the vocabulary: the 256 bytes, N - 257 merges and <|endoftext|> (the last id)")
    parser.add_argument("--out", required=True, type=path_argument, metavar="DIR",
                        help="the folder to write vocab.json and merges.txt into (created if missing)")
    parser.add_argument("--min-frequency", type=whole_number(1), default=2, metavar="N",
                        help="merge only pairs seen at least N times (2, as Hugging Face's "
                        "ByteLevelBPETokenizer.train; its BpeTrainer's own default, 0, merges every pair seen, as 1 "
                        "does here)")
    parser.add_argument("--json", action="store_true",
                        help='print {"folder", "vocab_size", "merges", "tokens", "bytes"} as one JSON object: the '
                        "vocabulary made, and how many tokens it splits the text into")
    return parser.parse_args(argv)


# Hugging Face's tokenizer loaders read these before, or beside, vocab.json + merges.txt: left there, they would win
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def check_out(out):  # -> None, or UsageError for a folder that cannot take the new tokenizer, before any training
    check_folder_path(out, "--out")
    try:
        held = [name for names in FILE_NAMES.values() for name in names if os.path.lexists(out / name)]
        if held:
            raise UsageError(f"--out {out} already holds {', '.join(held)}: a model's tokenizer is not replaced under "
                             "it; choose a new folder, or delete those files first")
        held = [name for name in HF_TOKENIZER_FILES if (out / name).exists()]
        if held:
            raise UsageError(f"--out {out} holds {', '.join(held)}, which Hugging Face's loaders would read instead "
                             "of the new files: choose a new folder, or delete those files first")
        existing = next(path for path in (out, *out.parents) if path.exists())
    except OSError as error:  # a folder on the way that this user may not enter
        raise UsageError(f"--out {out}: cannot read the folders on its way ({error.strerror}): fix their permissions "
                         "or choose another folder") from None
    check_writable(existing, f"--out {out}: cannot write into {existing}", "folder")


def write_out(out, merges):  # -> None: out holds both files, or neither, and no folder made for them
    # Both are written whole in a staging folder first, then take their names by hard links, which never replace a
    # file: another run that wrote --out since check_out keeps its files, and a failure or a Ctrl-C between the two
    # names takes back the first
    try:
        with made_folders(out):
            staging = Path(tempfile.mkdtemp(dir=out, prefix=".tokenizer-"))
            named = []
            try:
                save_tokenizer(staging, merges)
                for name in FILE_NAMES["Hugging Face"]:
                    take_name(staging / name, out / name)
                    named.append(name)
                fsync_folder(out)
            except BaseException:
                for name in named:
                    with suppress(OSError):
                        (out / name).unlink()
                raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        raise UsageError(f"cannot write --out {out} ({error.strerror or error}): {disk_fix(error)} or choose another "
                         "folder; nothing was written") from None


def take_name(staged, path):  # -> None: path names staged's file; UsageError when a file took that name meanwhile
    try:
        os.link(staged, path)
    except FileExistsError:
        raise appeared(path) from None
    except OSError:  # a file system without hard links (FAT, some network shares): the same, but for a moment's race
        if os.path.lexists(path):
            raise appeared(path) from None
        os.replace(staged, path)


def appeared(path):  # -> the UsageError for a file that another process put in --out while this one trained
    return UsageError(f"--out {path.parent}: {path.name} appeared there while the vocabulary was trained (another "
                      "run?); nothing was written: choose another folder")


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    check_out(args.out)
    text = read_data(args.data)
    merges = train_vocabulary(text, args.vocab_size, args.min_frequency, args.data)
    tokens = len(trained_tokenizer(merges).encode(text))
    n_bytes = len(text.encode("utf-8"))
    write_out(args.out, merges)
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
