"""One exception family: everything a user can cause (bad files, bad arguments, no network) raises a subclass of
Gpt2NumpyError, and `run_cli` turns it into a single line on stderr and a non-zero exit status."""
import argparse
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


class Interrupted(Gpt2NumpyError):
    """Ctrl-C, raised from KeyboardInterrupt by code that can say what was kept and how to go on."""

    exit_code = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C
    label = "interrupted"


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UsageErrors, so run_cli prints them as one line instead of a usage block; every
    command line gets --version from the installed package's metadata."""

    def __init__(self, *args, dash_hint=None, **kwargs):
        # dash_hint: how to pass text that begins with '-', which argparse takes for an unknown option
        super().__init__(*args, **kwargs)
        self.dash_hint = dash_hint
        self.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")

    def error(self, message):
        if self.dash_hint and ("arguments are required" in message or "unrecognized arguments: -" in message):
            message += f"; {self.dash_hint}"
        raise UsageError(f"{message} (see --help)")


def plural(n, noun):  # -> "1 token", "2 tokens": counts in messages read as sentences
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def log(message):  # diagnostics go to stderr, so stdout carries only what a command produces
    print(message, file=sys.stderr, flush=True)


def run_cli(main, argv=None):  # -> never returns: exits with main's status, or one error line
    try:
        status = main(argv)
    except Gpt2NumpyError as error:
        print(f"{error.label}: {error}", file=sys.stderr)
        status = error.exit_code
    except KeyboardInterrupt:  # Ctrl-C where no code said more: what was already printed stays
        print(f"{Interrupted.label}: stopped by Ctrl-C", file=sys.stderr)
        status = Interrupted.exit_code
    except BrokenPipeError:  # stdout's reader quit early (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not fail again
        status = 128 + 13  # the status of a process killed by SIGPIPE, as `cat` would report
    sys.exit(status)


def package_version():  # -> the installed gpt2_numpy's version, or a note when it runs from a source tree only
    try:
        return importlib.metadata.version("gpt2_numpy")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: pip install -e . to record a version)"
