"""The command lines, above the library: `gpt2-numpy COMMAND [flags]`, or `python -m gpt2_numpy COMMAND [flags]`.

Each command is the module of its name here, with a main(argv); what they share is common.py, and no command imports
another (explain's --sae flags call gpt2_numpy/sae/, as sae.py does). `python -m gpt2_numpy.X` of the library's
modules (generate, score, explain, train, download) runs the same command. A first
argument that names no command is a prompt: `gpt2-numpy PROMPT ...` is short for `gpt2-numpy generate PROMPT ...`,
except `help`, which prints the help as `gpt2-numpy help [COMMAND]`, and a command named after flags
(`gpt2-numpy --threads 1 score`), which is refused: flags come after their command.
"""
import difflib
import importlib
import sys

from gpt2_numpy.commands.common import package_version, run_cli, write_stdout
from gpt2_numpy.errors import UsageError

DESCRIPTION = "GPT-2 in pure NumPy: run, score, look inside and train."
COMMANDS = {  # name -> what it does, in one line; each is gpt2_numpy/commands/<name>.py, imported only when run
    "generate": "continue prompts, greedy or sampled, streaming the text",
    "score": "how likely a text is: loss, perplexity and bits per byte, per token too",
    "explain": "look inside: each step's shapes, attention, the logit lens, an HTML page",
    "train": "train a model on a text file, from scratch or from an official GPT-2",
    "tokenizer": "train a byte-level BPE tokenizer on a text file, as Hugging Face's trainer does",
    "download": "fetch an official GPT-2 (124M to 1558M), resuming and verifying it",
    "sae": "sparse autoencoders: sae train, sae eval (spliced in), sae features (a page of the latents)",
    "circuits": "circuits between transcoder features: circuits graph (an attribution graph, as circuit-tracer's)",
}


def main(argv=None):  # -> never returns: runs the command argv names, or exits with one error line
    argv = sys.argv[1:] if argv is None else list(argv)
    first = argv[0] if argv else None
    if first in COMMANDS:
        command = importlib.import_module(f"gpt2_numpy.commands.{first}")
        return command.main(argv[1:])
    if first == "help":  # as git and pip have it: gpt2-numpy help [COMMAND]
        if argv[1:2] and argv[1] not in COMMANDS:
            return run_cli(lambda _: refuse(argv[1], "help"))
        return main([*argv[1:2], "--help"])
    if first in ("-h", "--help", "--version"):
        return run_cli(lambda _: write_stdout(help_text() if first != "--version" else version_text()) or 0)
    if first is None or near_miss(first):
        return run_cli(lambda _: refuse(first))
    late = command_after_flags(argv)
    if late:  # gpt2-numpy --threads 1 score TEXT would otherwise continue the prompts "score" and TEXT, unsaid
        return run_cli(lambda _: refuse_late(late))
    return importlib.import_module("gpt2_numpy.commands.generate").main(argv)  # gpt2-numpy PROMPT ...


def near_miss(word):  # -> True when word looks like a misspelt command rather than a one-word prompt
    return not word.startswith("-") and bool(difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.75))


def command_after_flags(argv):  # -> the command named after a leading flag (--threads 1 score), or None
    words = argv[:argv.index("--")] if "--" in argv else argv
    return next((word for word in words if word in COMMANDS), None) if argv[0].startswith("-") else None


def refuse_late(command):  # -> never returns: UsageError saying that the command comes first
    raise UsageError(f"the command goes first, its flags after it: gpt2-numpy {command} [flags]; to continue the "
                     f"one-word prompt {command!r}, run gpt2-numpy generate [flags] {command}")


def refuse(word, asked=None):  # -> never returns: UsageError naming the commands; asked: "help" for help WORD
    names = ", ".join(COMMANDS)
    if word is None:
        raise UsageError(f"no command given: choose one of {names} (gpt2-numpy --help says what each does)")
    if asked:
        guess = "".join(f" (did you mean {match}?)" for match in difflib.get_close_matches(word, COMMANDS, n=1))
        raise UsageError(f"{asked}: unknown command {word!r}{guess}: choose one of {names}")
    guess = difflib.get_close_matches(word, COMMANDS, n=1)[0]
    raise UsageError(f"unknown command {word!r} (did you mean {guess}?): choose one of {names}; to continue the "
                     f"one-word prompt {word!r}, run gpt2-numpy generate {word}")


def help_text():  # -> what gpt2-numpy --help prints: every command with one line
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in COMMANDS.items()]
    return "\n".join([
        "usage: gpt2-numpy COMMAND [flags]  (gpt2-numpy help COMMAND lists its flags)",
        "       gpt2-numpy PROMPT ...  (short for gpt2-numpy generate PROMPT ...)", "", DESCRIPTION, "",
        "commands:", *lines, "", "python -m gpt2_numpy COMMAND is the same.", "",
    ])


def version_text():  # -> what gpt2-numpy --version prints
    return f"gpt2-numpy {package_version()}\n"
