"""One exception family: everything a user can cause (bad files, bad arguments, no network) raises a subclass of
Gpt2NumpyError, and the command lines (gpt2_numpy/commands/common.py's run_cli) turn it into a single line on stderr
and a non-zero exit status."""


class Gpt2NumpyError(Exception):
    """Base class: the message is one sentence saying what is wrong and what to do."""

    exit_code = 2
    label = "error"  # the word run_cli prints before the message

    def __init__(self, message, files=()):
        super().__init__(message)
        # the files a failed check compared, the one at fault first when all are equally trusted (loading.blame)
        self.files = tuple(files)


class UsageError(Gpt2NumpyError):
    """A command-line argument or API argument is invalid."""


class CheckpointError(Gpt2NumpyError):
    """A checkpoint file is missing, truncated, corrupt or inconsistent."""


class TokenizerError(Gpt2NumpyError):
    """A vocabulary file is missing or malformed."""


class OutOfVocabulary(Gpt2NumpyError, ValueError):
    """A text holds a token that the model has no embedding for (a model with a smaller vocabulary of its own)."""


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


class NothingToRecover(Gpt2NumpyError, ValueError):
    """Activation patching's two prompts give the same logit difference, so every recovery would be 0 / 0."""

    def __init__(self, logit_diff):
        super().__init__(f"the two prompts give the same logit difference ({logit_diff:.4g}), so there is nothing to "
                         "recover: choose a corrupt prompt that changes the answer")
        self.logit_diff = logit_diff


class Interrupted(Gpt2NumpyError):
    """Ctrl-C, raised from KeyboardInterrupt by code that can say what was kept and how to go on."""

    exit_code = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C
    label = "interrupted"
