"""One exception family: everything a user can cause (bad files, bad arguments, no network) raises a subclass of
Gpt2NumpyError, and `run_cli` turns it into a single line on stderr and a non-zero exit status."""
import argparse
import os
import sys


class Gpt2NumpyError(Exception):
    """Base class: the message is one sentence saying what is wrong and what to do."""

    exit_code = 2


class UsageError(Gpt2NumpyError):
    """A command-line argument or API argument is invalid."""


class CheckpointError(Gpt2NumpyError):
    """A checkpoint file is missing, truncated, corrupt or inconsistent."""


class TokenizerError(Gpt2NumpyError):
    """A vocabulary file is missing or malformed."""


class DownloadError(Gpt2NumpyError):
    """A download failed: no network, an HTTP error, a full disk, or bytes that fail their checksum."""

    exit_code = 1


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UsageErrors, so run_cli prints them as one line instead of a usage block."""

    def error(self, message):
        raise UsageError(f"{message} (see --help)")


def log(message):  # diagnostics go to stderr, so stdout carries only what a command produces
    print(message, file=sys.stderr, flush=True)


def run_cli(main, argv=None):  # -> never returns: exits with main's status, or one error line
    try:
        status = main(argv)
    except Gpt2NumpyError as error:
        print(f"error: {error}", file=sys.stderr)
        status = error.exit_code
    except KeyboardInterrupt:
        print(file=sys.stderr)  # Ctrl-C: end the line quietly, keep what was already printed
        status = 130
    except BrokenPipeError:  # stdout's reader quit early (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not fail again
        status = 128 + 13  # the status of a process killed by SIGPIPE, as `cat` would report
    sys.exit(status)
