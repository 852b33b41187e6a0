"""docs/sae.md prints what its commands print: `sae eval`'s output on my-sae is marked with the page's own eval command,
and a fresh run of README's first-run training, the page's `sae train` and that command (scripts/dev/page_outputs.py)
prints the same numbers. They had gone stale: the page showed L_clean 7.5491, L_sae 7.5494, L_zero 7.5633, recovered
0.9770 (from other flags than the page's) where a fresh run of its commands gave 7.4258, 7.4259, 7.4325 and 0.9843."""
import shlex

import pytest

from scripts.dev import page_outputs as outputs
from tests.docs.test_docs import blocks

PATH = outputs.REPO / "docs" / "sae.md"
PAGE = PATH.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):  # -> the page with every marked block's output made afresh
    return outputs.fresh_page(PATH, tmp_path_factory.mktemp("sae-page"))


def test_sae_eval_s_output_is_marked_with_the_page_s_own_eval_command():
    [marked] = outputs.MARKED.finditer(PAGE)
    assert shlex.split(marked["command"]) == outputs.command_line(PAGE, "python -m gpt2_numpy sae eval ")
    assert "L_clean" in marked["output"] and "loss recovered" in marked["output"]


def test_the_python_on_my_sae_is_a_block_the_docs_tests_run():
    # it once used `ids` without defining it, and nothing ran it: test_docs.py runs the blocks marked `python run`
    on_my_sae = [info for _, info, code in blocks(PAGE) if info.startswith("python") and 'load_sae("my-sae")' in code]
    assert on_my_sae == ["python run"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_page_prints_what_its_commands_print(fresh):
    assert outputs.differences(PAGE, fresh) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stale_recovered_share_is_caught(fresh):
    shown = fresh.split("loss recovered ")[1].split()[0]
    stale = f"{float(shown) - 0.01:.4f}"
    found = outputs.differences(fresh.replace(f"loss recovered {shown}", f"loss recovered {stale}", 1), fresh)
    assert len(found) == 1 and stale in found[0] and shown in found[0]
