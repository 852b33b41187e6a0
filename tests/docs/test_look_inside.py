"""docs/look-inside.md prints what its commands print: every output block of `my-gpt` is marked with its command, and a
fresh run of README's first-run training and of each command (scripts/dev/page_outputs.py) prints the same
numbers. The page's numbers had gone stale: "6.6100 before, 6.6155 after" where a fresh run gave 8.6261 and 8.6234."""
import re

import pytest

from scripts.dev import page_outputs as outputs

PATH = outputs.REPO / "docs" / "look-inside.md"
PAGE = PATH.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):  # -> the page with every marked block's output made afresh
    return outputs.fresh_page(PATH, tmp_path_factory.mktemp("look-inside"))


def output_blocks(text):  # -> [(the line above, the block's lines)] of each fenced block with no language: outputs
    blocks, lines, opened = [], text.splitlines(), None
    for number, line in enumerate(lines):
        if line.startswith("```") and opened is None:
            opened = number
        elif line.startswith("```"):
            if lines[opened] == "```":
                blocks.append((lines[opened - 1], lines[opened + 1:number]))
            opened = None
    return blocks


def test_every_output_of_my_gpt_is_marked_with_its_command():
    blocks = output_blocks(PAGE)
    assert len(blocks) >= 4
    for above, body in blocks:
        assert above.startswith("<!-- output of: python -m gpt2_numpy.explain --model my-gpt "), (above, body)


def test_the_page_prints_what_its_commands_print(fresh):
    assert outputs.differences(PAGE, fresh) == []


def test_a_stale_number_is_caught_and_the_last_digit_s_rounding_is_not(fresh):
    number = re.search(r"loss over the prompt: (\d+\.\d{4}) before", fresh)[1]
    last = int(number[-1])
    nudged = number[:-1] + str(last + 1 if last < 9 else last - 1)  # one unit of the last digit: the same number
    assert outputs.differences(fresh.replace(number, nudged, 1), fresh) == []
    stale = f"{float(number) - 2:.4f}"
    found = outputs.differences(fresh.replace(number, stale, 1), fresh)
    assert len(found) == 1 and stale in found[0] and number in found[0]
    assert outputs.differences(fresh.replace("(through ln_f), largest", "(through ln_f), smallest", 1), fresh)
