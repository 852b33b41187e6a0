"""docs/testing.md's test counts are pytest's collection of this checkout (scripts/dev/count_tests.py regenerates
them): they had gone stale, 1,157 of 1,593 where pytest collected over 1,800."""
import pytest

from scripts.dev import count_tests


def test_the_page_s_sentence_is_read_as_its_two_counts():
    text = "The quick lane runs 1,157 of the 1,593 tests. Beside"
    assert count_tests.page_counts(text) == (1157, 1593)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_page_counts_the_tests_pytest_collects():
    assert count_tests.page_counts(count_tests.PAGE.read_text(encoding="utf-8")) == count_tests.collected()
