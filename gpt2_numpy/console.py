"""stderr, for the library and the command lines alike: diagnostics, counts that read as sentences, progress bars.
stdout is left to what a command produces; nothing written here may stop a run when stderr's reader is gone."""
import sys
from contextlib import suppress


def plural(n, noun):  # -> "1 token", "2 tokens": counts in messages read as sentences
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def log(message):  # diagnostics go to stderr, so stdout carries only what a command produces
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:  # stderr is full or not writable: the diagnostics are lost, the command's output must not be
        pass


def progress_bar(**options):  # -> a tqdm bar on stderr that fails as quietly as log()
    from tqdm import tqdm  # imported on first use: it costs a short command's run time

    return tqdm(file=QuietStderr(), **options)


class QuietStderr:
    """stderr for a progress bar, failing as quietly as log() does: losing stderr's reader (`2>&1 | head`) or room
    for it must not stop a run."""

    def write(self, text):
        with suppress(OSError, ValueError):  # ValueError: stderr was closed under us
            sys.stderr.write(text)

    def flush(self):
        with suppress(OSError, ValueError):
            sys.stderr.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno: stderr's, so the bar looks as it would there
        return getattr(sys.stderr, name)
