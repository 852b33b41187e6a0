"""What the command lines share: the parser and its argument types, running a command (errors become one line on
stderr and an exit status), stdout, the flags that choose a model and loading it (downloading it first if missing),
reading the prompt, and the files a command writes (checked before the model loads, so a typo costs no load, and written
whole or not at all). No command imports another; they all import this."""
import argparse
import contextlib
import difflib
import errno
import importlib.metadata
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from gpt2_numpy import cores
from gpt2_numpy.allocator import keep_freed_memory
from gpt2_numpy.catalog import MODEL_SIZES, OFFICIAL_HPARAMS, SOURCES
from gpt2_numpy.console import log, plural
from gpt2_numpy.disk import atomic_write, disk_fix, write_problem
from gpt2_numpy.errors import Gpt2NumpyError, Interrupted, OutOfMemory, OutputError, UsageError
from gpt2_numpy.formats import read_text
from gpt2_numpy.loading import load_model, where

DEFAULT_SIZE = "124M"
# `--data sample:` (and --mean-over) reads a short text that ships with the package: a first run needs no file of
# its own, from a clone or an installed wheel alike; a colon, so that it names no file a user would have made
SAMPLE_NAME = "sample:"
SAMPLE_TEXT = Path(__file__).resolve().parents[1] / "data" / "sample.txt"

# --- The parser and its argument types ---


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UsageErrors, so run_cli prints them as one line instead of a usage block, with a
    hint where one applies; every command line gets --version from the installed package's metadata. An option is
    never taken from a prefix of its name: --model must not be read as --models-dir, nor an old spelling as a new
    one."""

    def __init__(self, *args, dash_hint=None, runs_model=True, **kwargs):
        # dash_hint: how to pass text that begins with '-', which argparse takes for an unknown option; runs_model:
        # whether the command runs a model, whose thread count --threads and $GPT2_NUMPY_THREADS set
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.dash_hint, self.runs_model = dash_hint, runs_model
        self.given = None  # the command line up to "--", once parsed: errors name the flags misspelt in it
        self.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
        if runs_model:
            self.add_argument("--threads", type=whole_number(1), metavar="N",
                              help=f"cores the model may use, NumPy's BLAS and gpt2_numpy's own threads together "
                              f"(default: ${cores.THREADS_VARIABLE}, else ${', then $'.join(cores.BLAS_VARIABLES)}, "
                              f"else those of the {cores.available_cores()} this process may run on that other "
                              "processes leave free)")

    def parse_known_args(self, args=None, namespace=None):  # -> (namespace, extras)
        first = self.given is None
        if first:  # the first call sees the whole command line; intermixed parsing calls again with parts
            given = sys.argv[1:] if args is None else list(args)
            self.given = given[:given.index("--")] if "--" in given else given
            # argparse reads "-hello" (even "-hello world") as -h with "ello" attached: an error on Python 3.9, the
            # help on 3.13. It is rather a prompt, or a typo
            attached = [word for word in self.given if word.startswith("-h") and word != "-h"]
            if attached:  # text, so the dash hint applies, even to "-h ello", whose first word alone is a flag
                raise UsageError("; ".join(filter(None, [f"unrecognized arguments: {attached[0]}", self.dash_hint]))
                                 + " (see --help)")
        namespace, extras = super().parse_known_args(args, namespace)
        if self.runs_model:
            use_threads(namespace.threads, note=first)
        return namespace, extras

    def error(self, message):
        raise UsageError(f"{usage_hints(self, message)} (see --help)")


def use_threads(count, note):  # -> None; the thread count in force from here on: count, else the default's
    try:
        count = cores.set_threads(count) if count is not None else cores.given_threads()
        cores.threads()  # OpenBLAS set to it (or to the free cores) now
    except ValueError as error:  # a bad $GPT2_NUMPY_THREADS
        raise UsageError(f"{error}; or unset it") from None
    if note and count is not None and count > cores.available_cores():  # allowed, and slower: said once
        log(f"note: {plural(count, 'thread')} on {plural(cores.available_cores(), 'core')} take turns on them, which "
            f"is slower than {cores.available_cores()}")


def usage_hints(parser, message):  # -> argparse's message, with the hints that apply to it
    # a missing argument, say: the flags misspelt anywhere before "--" are named too
    words = message.split(": ", 1)[1].split() if message.startswith("unrecognized arguments: ") else parser.given or []
    unknown = [word for word in words if word.startswith("-") and word != "-" and not
               parser._negative_number_matcher.match(word) and word.split("=")[0] not in parser._option_string_actions]
    missing = re.fullmatch(r"the following arguments are required: ([A-Z]+)", message)
    if missing and parser.dash_hint:  # the text that a command works on, and nothing else, is missing
        message = f"no {missing[1].lower()} given: {parser.prog} needs one, e.g. {parser.prog} \"The cat\""
    hints = [flag_hint(parser, word) for word in unknown if FLAG.fullmatch(word)]
    if parser.dash_hint and any(not FLAG.fullmatch(word) for word in unknown):  # text such as "-x", not a flag
        hints.append(parser.dash_hint)
    return "; ".join([message, *filter(None, hints)])


def flag_hint(parser, word):  # -> "did you mean --n-tokens instead of --tokens?", or None when no flag is near
    name = word.split("=")[0]
    options = [option for option in parser._option_string_actions if option.startswith("--")]
    near = [option for option in options if option.startswith(name)] or difflib.get_close_matches(name, options, n=1,
                                                                                                   cutoff=0.7)
    return f"did you mean {' or '.join(near)} instead of {name}?" if near else None


FLAG = re.compile(r"--[A-Za-z][-\w]*(=.*)?")  # what is meant as a flag: "--tokens", not "-x" or "--5"


def package_version():  # -> the installed gpt2_numpy's version, or a note when it runs from a source tree only
    try:
        return importlib.metadata.version("gpt2_numpy")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: pip install -e . to record a version)"


def whole_number(minimum):  # -> an argparse type accepting integers >= minimum
    def parse(text):
        value = int(text)  # argparse turns the ValueError into "invalid whole number value: 'x'"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def number_between(low, high, name, low_included=False):  # -> an argparse type for a number between low and high,
    # high excluded, low too unless low_included
    def parse(text):
        value = float(text)
        if not ((low <= value) if low_included else (low < value)) or not value < high:  # NaN too
            raise ValueError(text)  # argparse says "invalid <name> value: 'x'"
        return value

    parse.__name__ = name
    return parse


positive_float = number_between(0, math.inf, "positive number")
non_negative_float = number_between(0, math.inf, "number at least 0", low_included=True)
fraction = number_between(0, 1, "fraction between 0 and 1")


def repeated(items):  # -> the first item given a second time, or None: a flag's list that names one thing twice
    return next((item for number, item in enumerate(items) if item in items[:number]), None)


def path_argument(text):  # -> an argparse type: a Path, never of "" (Path("") would be the current folder)
    # "~/x" is the home folder's x, as a shell makes it unquoted and as --models-dir and $GPT2_NUMPY_WEIGHTS always
    # meant it: a quoted --out '~/x' made a folder named "~" in the current one
    if not text:
        raise argparse.ArgumentTypeError("is empty: name a file or folder")
    return Path(text).expanduser()


def size_name(text):  # -> an argparse type: an official size in any case as its name ("124m" -> "124M"), else text
    return text.upper() if text.upper() in MODEL_SIZES else text


def model_choice(text):  # -> an argparse type: an official size as its name, anything else as a folder's Path
    size = size_name(text)
    return size if size in MODEL_SIZES else path_argument(text)  # a folder named like a size is written ./124M


model_choice.__name__ = "model"

# --- Running a command, and stdout ---


def run_cli(main, argv=None):  # -> never returns: exits with main's status, or one error line
    open_closed_streams()
    try:
        if sys.stdout is not None:  # a terminal that cannot show a character gets "?", not a traceback
            sys.stdout.reconfigure(errors="replace")
        status = main(argv)
        if sys.stdout is not None:
            with writing_stdout():  # what print() left in the buffer: a full disk is reported here, not at exit
                sys.stdout.flush()
    except Gpt2NumpyError as error:
        log(f"{error.label}: {error}")
        status = error.exit_code
    except MemoryError:  # where no code said what to lower
        log(f"{OutOfMemory.label}: this machine ran out of memory: ask for less at once (a smaller model, fewer rows, "
            "a shorter text)")
        status = OutOfMemory.exit_code
    except KeyboardInterrupt:  # Ctrl-C where no code said more: what was already printed stays
        log(f"{Interrupted.label}: stopped by Ctrl-C")
        status = Interrupted.exit_code
    except BrokenPipeError:  # stdout's reader quit early (`| head`): stop quietly
        silence_stdout()
        status = 128 + 13  # the status of a process killed by SIGPIPE, as `cat` would report
    sys.exit(status)


def run_model_cli(main, argv=None):  # -> never returns: run_cli for a command that runs the model's forward pass
    with np.errstate(invalid="ignore", over="ignore"):  # NaN or inf from the weights: NonFiniteError says it once
        run_cli(main, argv)


def open_closed_streams():  # -> None; a standard stream closed at start (`2>&-`, which makes it None) gets /dev/null
    # else the next file opened would take its descriptor, and what is written to the stream would land in that file.
    # In ascending order, each open takes the lowest free descriptor: the closed stream's. sys.stdin and sys.stdout
    # stay None, so that reading the prompt from stdin, or writing output, says the stream is closed.
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if stream is None:
            os.open(os.devnull, os.O_RDWR)
    if sys.stderr is None:  # print(file=None) would write the diagnostics to stdout
        sys.stderr = open(os.devnull, "w")


@contextlib.contextmanager
def writing_stdout():  # -> context in which writing stdout fails with OutputError (a BrokenPipeError passes)
    stdout = open_stdout()
    try:
        yield stdout
    except BrokenPipeError:
        raise
    except OSError as error:
        silence_stdout()
        raise OutputError(f"cannot write to stdout ({error.strerror}): send it to a file or pipe that takes the output"
                          + (", on a disk with free space" if error.errno == errno.ENOSPC else "")) from None


def open_stdout():  # -> sys.stdout; OutputError when it was closed at start (`>&-`)
    if sys.stdout is None:
        raise OutputError("stdout is closed: give the command somewhere to write its output, e.g. > out.txt")
    return sys.stdout


def silence_stdout():  # -> None; stdout failed: what is left in its buffer goes to /dev/null
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not fail again


def write_stdout(text):  # -> None; OutputError when stdout is closed or refuses the text
    with writing_stdout() as stdout:
        stdout.write(text)
        stdout.flush()  # each token appears as soon as it is chosen, even through a pipe


def print_json(data):  # -> None; data as one line of JSON on stdout
    write_stdout(json.dumps(data) + "\n")


def subcommand_cli(command, subcommands, handlers):  # -> (run, main) of a command made of subcommands: run(argv)
    # returns the exit status (run_subcommand's); main(argv) exits, errors as one line (run_model_cli's)
    def run(argv=None):
        return run_subcommand(command, subcommands, handlers, argv)

    return run, lambda argv=None: run_model_cli(run, argv)


def run_subcommand(command, subcommands, handlers, argv=None):  # -> exit status of the subcommand argv names
    """`gpt2-numpy COMMAND SUBCOMMAND [flags]`: handlers[SUBCOMMAND](flags); subcommands: {name: what it does}, for
    --help and for the error naming them."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in handlers:
        return handlers[argv[0]](argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        width = max(map(len, subcommands))
        write_stdout(f"usage: gpt2-numpy {command} {{{','.join(subcommands)}}} [flags]\n\n" + "\n".join(
            f"  {name:<{width}}  {what}" for name, what in subcommands.items()) + "\n")
        return 0
    guesses = difflib.get_close_matches(argv[0], subcommands, n=1) if argv else []
    given = f"unknown subcommand {argv[0]!r}" if argv else "no subcommand given"
    given += "".join(f" (did you mean {guess}?)" for guess in guesses)
    raise UsageError(f"{given}: choose one of {', '.join(subcommands)} (gpt2-numpy {command} {next(iter(subcommands))} "
                     "--help, ...)")


# --- The model ---


def add_model_args(parser):  # -> None; adds --model (and its old name --model-size), --models-dir and --source
    names = parser.add_mutually_exclusive_group()  # both write args.model: the last one given would win silently
    names.add_argument("--model", type=model_choice, metavar="MODEL",
                        help=f"an official GPT-2 size ({', '.join(MODEL_SIZES)}, in any case: 124m is 124M; "
                        f"{DEFAULT_SIZE} by default), downloaded on first use, or a model folder (OpenAI's or Hugging "
                        "Face's layout, e.g. one written by train; a folder named like a size is written ./124M)")
    names.add_argument("--model-size", dest="model", type=size_name, choices=MODEL_SIZES,
                       help="old name of --model SIZE")
    add_models_dir(parser)
    parser.add_argument("--source", choices=SOURCES, default="openai",
                        help="whose files an official size comes from: openai (TF checkpoint in <size>/, default) or "
                        "huggingface (safetensors in <size>-hf/)")


def add_models_dir(parser, use=""):  # -> None; adds --models-dir, which every command that takes a size shares
    parser.add_argument("--models-dir", type=path_argument, metavar="DIR",
                        help=f"folder of <size>/ folders{use} (default: $GPT2_NUMPY_WEIGHTS, else ./weights)")


def model_size(args):  # -> the official size add_model_args's flags name, or None when --model is a folder
    model = getattr(args, "model", None) or DEFAULT_SIZE  # callers may build args without --model
    return model if isinstance(model, str) else None


def model_from_args(args):  # -> Model(hparams, params, tokenizer) that add_model_args's flags name, verified before use
    size = model_size(args)
    # a size: missing files are downloaded, and files never verified are verified once, by loading them (a damaged
    # file placed by hand is refused with the downloader's own error instead of generating garbage); later loads only
    # memory-map them. A folder is used as it is: nothing is downloaded or recorded there
    keep_freed_memory()  # every command runs forward passes next, which free and reallocate the same large arrays
    start = time.perf_counter()
    model = load_model(size or args.model, args.models_dir, args.source, name=None if size else f"--model {args.model}")
    folder = where(size, args.models_dir, args.source) if size else args.model
    log(f"loaded {loaded_name(size, model.hparams)} from {folder} in {time.perf_counter() - start:.1f} s")
    return model


def loaded_name(size, hparams):  # -> "GPT-2 124M", or the shape of what a folder holds
    if size is None:
        return (f"a GPT-2 of {plural(hparams['n_layer'], 'layer')}, {hparams['n_embd']} wide, "
                f"{plural(hparams['n_head'], 'head')},")
    if hparams == OFFICIAL_HPARAMS[size]:
        return f"GPT-2 {size}"
    shape = ", ".join(f"{key} {value}" for key, value in hparams.items())
    other = next((f"GPT-2 {name}'s shape, " for name, official in OFFICIAL_HPARAMS.items() if official == hparams), "")
    return f"a GPT-2 of {other}{shape} (not the {size} that --model asked for)"


# --- The prompt ---


def read_data(path, flag="--data"):  # -> the UTF-8 text of the file a flag names (or the package's sample:)
    def fail(error):  # a UsageError saying why the file cannot be read
        if isinstance(error, UnicodeDecodeError):
            return UsageError(f"{flag} {path} is not UTF-8 text (byte {error.start} cannot be decoded): convert it to "
                              "UTF-8 first")
        return UsageError(f"cannot read {flag} {path}: {error.strerror or error}")
    return read_text(SAMPLE_TEXT if str(path) == SAMPLE_NAME else path, fail)


def read_prompt(argument, what="the prompt"):  # -> the text of a command-line argument; "-" reads stdin
    if argument != "-":
        text = argument
    elif sys.stdin is None:  # started with stdin closed (`0<&-`)
        raise UsageError(f'stdin is closed, and "-" reads {what} from it: pipe the text in, or give it as an '
                         "argument")
    else:
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except OSError as error:  # e.g. `< folder`, or a descriptor open for writing only
            raise UsageError(f"cannot read {what} from stdin ({error.strerror}): pipe the text in, or give it as "
                             "an argument") from None
        except UnicodeDecodeError as error:
            raise UsageError(f"stdin is not UTF-8 text (byte {error.start}): convert {what} to UTF-8") from None
    try:
        text.encode("utf-8")  # undecodable command-line bytes arrive as lone surrogates
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid UTF-8 text: pass it in UTF-8, or through stdin with '-'") from None
    return text


# --- Files a command writes ---


HTML_SUFFIXES = (".html", ".htm")  # explain --html's page and sae features --html's


def check_output_file(path, flag, suffixes):  # -> None, or UsageError saying what is wrong with the file name
    """UsageError when `path` is a folder, does not end in one of `suffixes`, or lies in a folder that does not exist
    or that this user cannot write into."""
    names = " or ".join(suffixes)
    try:
        if path.is_dir():
            raise UsageError(f"{flag} {path} is a folder: name a {names} file")
        if path.suffix.lower() not in suffixes:
            raise UsageError(f"{flag} {path}: the file name must end in {names} (got "
                             f"{repr(path.suffix) if path.suffix else 'no suffix'})")
        folder = Path(os.path.realpath(path)).parent  # a symlink is written through to its file (atomic_write)
        existing = next(above for above in (folder, *folder.parents) if above.exists())
        if not existing.is_dir():
            raise UsageError(f"{flag} {path}: {existing} is a file, not a folder; choose another file")
        if not folder.is_dir():
            raise UsageError(f"{flag} {path}: the folder {folder} does not exist; create it or choose another file")
    except OSError as error:  # a folder on the way that this user may not enter
        raise UsageError(f"{flag} {path}: cannot read the folder {path.parent} ({error.strerror}): fix its "
                         "permissions or choose another file") from None
    check_writable(folder, f"{flag} {path}: cannot write into the folder {folder}", "file")


def check_writable(folder, refusal, other):  # -> None; UsageError when no file can be made in folder: the refusal,
    # why and the fix (disk.write_problem's), or another `other` ("file", "folder") to choose
    problem = write_problem(folder)
    if problem:
        raise UsageError(f"{refusal} {problem} or choose another {other}")


def save_figure(figure, path):  # -> None; path then holds a matplotlib figure's whole image, or is left as it was
    suffix = path.suffix.lower()[1:]
    metadata = {"Date": None} if suffix == "svg" else None  # an SVG without its date: the same prompt, the same file
    write_atomically(path, lambda file: figure.savefig(file, format=suffix, metadata=metadata), "the plot")


def write_atomically(path, write, what):  # write(binary file) -> None; disk.atomic_write, saying what failed
    try:
        atomic_write(path, write)
    except OSError as error:
        raise UsageError(f"cannot write {what} {path}: {error.strerror or error}: {disk_fix(error)} or choose "
                         "another file") from None
