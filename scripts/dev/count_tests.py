"""Recount the tests that docs/testing.md counts, "The quick lane runs Q of the N tests", from pytest's own collection
of this checkout (`pytest --collect-only -q -m "not slow"`: Q selected of N collected, skipped tests included):

    python -m scripts.dev.count_tests            # rewrite the sentence with today's counts
    python -m scripts.dev.count_tests --check    # exit 1, saying both counts, when the page is stale

Run it after adding or removing tests; tests/docs/test_testing_page.py runs the check.
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "testing.md"
SENTENCE = re.compile(r"The quick lane runs ([\d,]+) of the ([\d,]+) tests")
COLLECTED = re.compile(r"^(\d+)(?:/(\d+))? tests? collected", re.MULTILINE)


def collected():  # -> (tests in the quick lane, tests in all), as pytest collects them here
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                             "not slow"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                            text=True, timeout=300)
    found = COLLECTED.search(result.stdout)
    if result.returncode or not found:
        raise SystemExit(f"error: pytest could not collect the tests ({result.returncode}):\n{result.stdout[-2000:]}")
    quick, total = int(found[1]), int(found[2] or found[1])
    return quick, total


def page_counts(text):  # -> (quick, total) as the page says them
    found = SENTENCE.search(text)
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing: exit 1 when the counts are stale")
    args = parser.parse_args()
    text, (quick, total) = PAGE.read_text(encoding="utf-8"), collected()
    if args.check:
        shown = page_counts(text)
        print(f"{PAGE.name}: {shown[0]:,} of {shown[1]:,}; collected: {quick:,} of {total:,}")
        sys.exit(0 if shown == (quick, total) else 1)
    PAGE.write_text(SENTENCE.sub(f"The quick lane runs {quick:,} of the {total:,} tests", text, count=1),
                    encoding="utf-8")
    print(f"{PAGE.relative_to(REPO)}: the quick lane runs {quick:,} of the {total:,} tests")


if __name__ == "__main__":
    main()
