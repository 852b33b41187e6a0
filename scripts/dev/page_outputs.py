"""Regenerate what a page of docs/ prints from commands: every output block under a marker

    <!-- output of: python -m gpt2_numpy.explain --model my-gpt "The cat sat on the mat" --ablate 1.0 1.1 -->
    ```
    (the command's stdout)
    ```

is that command's stdout, run in an empty folder (the commands read the package's `sample:`, no clone's file) holding
`my-gpt`, the tiny model that README's first run trains (its own train command, taken from README.md, run here as it
is written there), and what the page's own commands named in SETUP make first (docs/sae.md: its `sae train`, which
writes my-sae), each taken from the page as it is written there.

    python -m scripts.dev.page_outputs                          # rewrite the output blocks of every page of PAGES
    python -m scripts.dev.page_outputs docs/sae.md --check      # exit 1, saying what differs, when the page is stale

--check compares number by number, each to within one unit of its last printed digit (float rounding differs
across CPUs and thread counts: 0.0127 against 0.0128 is the same number; 6.6100 against 8.6261 is a stale page), and
every other word exactly. tests/docs/test_look_inside.py and tests/docs/test_sae_page.py run the check.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# page -> the starts of its own commands that make what its marked commands read, run first in the page's order
SETUP = {"docs/look-inside.md": (), "docs/sae.md": ("python -m gpt2_numpy sae train ",)}
PAGES = [REPO / name for name in SETUP]
MARKED = re.compile(r"<!-- output of: (?P<command>.+?) -->\n```\n(?P<output>.*?)```\n", re.S)
NUMBER = re.compile(r"^[-+]?\d+\.\d+$")


def command_line(text, start):  # -> argv of the first command line of text that begins with start, "\\" lines joined
    return shlex.split(next(line for line in text.replace("\\\n", " ").splitlines() if line.startswith(start)))


def run(argv, folder):  # -> the stdout of `python -m ...` (this interpreter, this checkout) in folder
    if argv[:2] != ["python", "-m"]:
        raise SystemExit(f"error: a marked command must start with 'python -m', got {shlex.join(argv)}")
    # no user's weights or settings; a thread count, when set, passes: the check holds at any
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(folder),
           **{name: os.environ[name] for name in ("GPT2_NUMPY_THREADS",) if name in os.environ}}
    result = subprocess.run([sys.executable, *argv[1:]], cwd=folder, env=env, capture_output=True, text=True,
                            timeout=600)
    if result.returncode:
        raise SystemExit(f"error: {shlex.join(argv)} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout


def fresh_page(path, folder):  # -> the text of the page at path with each marked block's output made afresh
    page = path.read_text(encoding="utf-8")
    run(command_line((REPO / "README.md").read_text(encoding="utf-8"), "python -m gpt2_numpy.train "), folder)
    for start in SETUP[path.relative_to(REPO).as_posix()]:
        run(command_line(page, start), folder)

    def block(match):
        command = match["command"]
        return f"<!-- output of: {command} -->\n```\n{run(shlex.split(command), folder)}```\n"

    return MARKED.sub(block, page)


def differences(page, fresh):  # -> ["command: shown ... fresh ..."] for each block whose words differ
    found = []
    for shown, made in zip(MARKED.finditer(page), MARKED.finditer(fresh)):
        for old, new in zip(shown["output"].splitlines(), made["output"].splitlines()):
            if not all(map(same_word, old.split(), new.split())) or len(old.split()) != len(new.split()):
                found.append(f"{shown['command']}:\n  page:  {old}\n  fresh: {new}")
        if len(shown["output"].splitlines()) != len(made["output"].splitlines()):
            found.append(f"{shown['command']}: {len(shown['output'].splitlines())} lines on the page, "
                         f"{len(made['output'].splitlines())} fresh")
    return found


def same_word(old, new):  # -> whether two printed words agree: numbers to one unit of their last digit
    if not (NUMBER.match(old) and NUMBER.match(new)):
        return old == new
    unit = 10.0 ** -len(old.partition(".")[2])
    return abs(float(old) - float(new)) <= unit * 1.01


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="*", type=Path, metavar="PAGE", help=f"of {', '.join(SETUP)} (all of them)")
    parser.add_argument("--check", action="store_true", help="change nothing: exit 1 when a page is stale")
    args = parser.parse_args()
    paths = [path.resolve() for path in args.pages] or PAGES
    unknown = [str(path) for path in paths if path not in PAGES]
    if unknown:
        parser.error(f"{', '.join(unknown)}: not a page with marked outputs ({', '.join(SETUP)})")
    stale = False
    for path in paths:
        page = path.read_text(encoding="utf-8")
        with tempfile.TemporaryDirectory() as folder:
            fresh = fresh_page(path, Path(folder))
        if args.check:
            found = differences(page, fresh)
            print("\n".join(found) or f"{path.name}: every marked output is what its command prints")
            stale = stale or bool(found)
        else:
            path.write_text(fresh, encoding="utf-8")
            print(f"rewrote {len(MARKED.findall(page))} output blocks of {path.relative_to(REPO)}")
    sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
