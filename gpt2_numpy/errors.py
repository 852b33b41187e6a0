"""One exception family: everything a user can cause (bad files, bad arguments, no network) raises a subclass of
Gpt2NumpyError, and `run_cli` turns it into a single line on stderr and a non-zero exit status."""
import argparse
import contextlib
import errno
import importlib.metadata
import os
import sys


class Gpt2NumpyError(Exception):
    """Base class: the message is one sentence saying what is wrong and what to do."""

    exit_code = 2
    label = "error"  # the word run_cli prints before the message

    def __init__(self, message, files=()):
        super().__init__(message)
        # the files a failed check compared, the one at fault first when all are equally trusted (see weights.blame)
        self.files = tuple(files)


class UsageError(Gpt2NumpyError):
    """A command-line argument or API argument is invalid."""


class CheckpointError(Gpt2NumpyError):
    """A checkpoint file is missing, truncated, corrupt or inconsistent."""


class TokenizerError(Gpt2NumpyError):
    """A vocabulary file is missing or malformed."""


class DownloadError(Gpt2NumpyError):
    """A download failed: no network, an HTTP error, a full disk, or bytes that fail their checksum."""

    exit_code = 1


class OutputError(Gpt2NumpyError):
    """stdout is closed, or refuses what is written to it (a full disk, a read-only descriptor)."""

    exit_code = 1


class OutOfMemory(Gpt2NumpyError):
    """An array the run needs is larger than this machine can allocate."""

    exit_code = 1


class TrainingFailed(Gpt2NumpyError):
    """A training run cannot go on: its folder's disk refuses a write, or the loss diverged. Its last save stays."""

    exit_code = 1


class NonFiniteError(CheckpointError):
    """The model computed NaN or infinity: a checkpoint whose bytes are intact can still hold them."""

    def __init__(self):
        super().__init__("the model's outputs are NaN or infinite: its weights hold NaN or infinite values (as a "
                         "checkpoint saved from a diverged training run can), or values so large that float32 "
                         "overflows; use another checkpoint")


class Interrupted(Gpt2NumpyError):
    """Ctrl-C, raised from KeyboardInterrupt by code that can say what was kept and how to go on."""

    exit_code = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C
    label = "interrupted"


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UsageErrors, so run_cli prints them as one line instead of a usage block; every
    command line gets --version from the installed package's metadata. Flags must be spelled out: with abbreviations,
    train's --model DIR would silently become --models-dir DIR."""

    def __init__(self, *args, dash_hint=None, **kwargs):
        # dash_hint: how to pass text that begins with '-', which argparse takes for an unknown option
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.dash_hint = dash_hint
        self.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")

    def error(self, message):
        if self.dash_hint and ("arguments are required" in message or "unrecognized arguments: -" in message):
            message += f"; {self.dash_hint}"
        raise UsageError(f"{message} (see --help)")


def plural(n, noun):  # -> "1 token", "2 tokens": counts in messages read as sentences
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def log(message):  # diagnostics go to stderr, so stdout carries only what a command produces
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:  # stderr is full or not writable: the diagnostics are lost, the command's output must not be
        pass


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


def package_version():  # -> the installed gpt2_numpy's version, or a note when it runs from a source tree only
    try:
        return importlib.metadata.version("gpt2_numpy")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: pip install -e . to record a version)"
