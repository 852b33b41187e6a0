"""Regenerate what docs/look-inside.md prints from commands: every output block under a marker

    <!-- output of: python -m gpt2_numpy.explain --model my-gpt "The cat sat on the mat" --ablate 1.0 1.1 -->
    ```
    (the command's stdout)
    ```

is that command's stdout, run in a folder holding a copy of README.md and `my-gpt`, the tiny model that README's
first run trains (its own train command, taken from README.md, run here as it is written there).

    python -m scripts.dev.look_inside_outputs            # rewrite the page's output blocks
    python -m scripts.dev.look_inside_outputs --check    # exit 1, saying what differs, when the page is stale

--check compares number by number, each to within one unit of its last printed digit (float rounding differs
across CPUs and thread counts: 0.0127 against 0.0128 is the same number; 6.6100 against 8.6261 is a stale page), and
every other word exactly. tests/test_docs_look_inside.py runs the check.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "look-inside.md"
MARKED = re.compile(r"<!-- output of: (?P<command>.+?) -->\n```\n(?P<output>.*?)```\n", re.S)
NUMBER = re.compile(r"^[-+]?\d+\.\d+$")


def first_run_train(readme):  # -> argv of README.md's command that trains my-gpt, its "\" continuations joined
    text = readme.replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("python -m gpt2_numpy.train") and "my-gpt" in
                line)
    return shlex.split(line)


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


def fresh_page(page, folder):  # -> the page with each marked block's output replaced by its command's, run afresh
    shutil.copy(REPO / "README.md", folder / "README.md")
    run(first_run_train((REPO / "README.md").read_text(encoding="utf-8")), folder)

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
    parser.add_argument("--check", action="store_true", help="change nothing: exit 1 when the page is stale")
    args = parser.parse_args()
    page = PAGE.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as folder:
        fresh = fresh_page(page, Path(folder))
    if args.check:
        found = differences(page, fresh)
        print("\n".join(found) or f"{PAGE.name}: every marked output is what its command prints")
        sys.exit(1 if found else 0)
    PAGE.write_text(fresh, encoding="utf-8")
    print(f"rewrote {len(MARKED.findall(page))} output blocks of {PAGE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
