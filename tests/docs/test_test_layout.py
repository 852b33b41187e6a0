"""docs/testing.md's rule for where a module's tests live, held to the tree: every module of gpt2_numpy has a test file
of its name (tests/unit/ or tests/hostile/ for the library, tests/cli/ for commands/) or a row in the page's table that
names the files testing it; the table names only modules and files that exist, each module once, and no module that has
a file of its name. Moving or adding a module means updating that table, which this file reads."""
import re

from tests.conftest import REPO

PAGE = REPO / "docs" / "testing.md"
SECTION = "## Which file tests a module"
ROW = re.compile(r"^\|(?P<modules>[^|]*)\|(?P<tests>[^|]*)\|$")
MODULE = re.compile(r"`(gpt2_numpy/[^`]+\.py)`")  # other names in backquotes are prose
TEST = re.compile(r"`(tests/[^`]+\.py)`")


def table():  # -> {module path: [test file paths]}, as the page's table writes them (relative to the repo)
    section = PAGE.read_text(encoding="utf-8").split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = ROW.match(line.strip())
        modules = MODULE.findall(match["modules"]) if match else []  # the header and its rule name none
        for module in modules:
            assert module not in rows, f"docs/testing.md lists {module} twice"
            rows[module] = TEST.findall(match["tests"])
    return rows


def modules():  # -> every module of the package, as a path relative to the repo
    return sorted(path.relative_to(REPO).as_posix() for path in (REPO / "gpt2_numpy").rglob("*.py"))


def namesake(module):  # -> the test file of module's name that exists, or None; a package's modules (sae/model.py)
    # are tested in the folder of its name when the lane has one (tests/unit/sae/test_model.py)
    package, name = module.split("/")[-2], "test_" + module.split("/")[-1]
    lanes = ["cli"] if package == "commands" else ["unit", "hostile"]
    folders = [f"{lane}/{package}" if (REPO / "tests" / lane / package).is_dir() else lane for lane in lanes]
    return next((f"tests/{folder}/{name}" for folder in folders if (REPO / "tests" / folder / name).is_file()), None)


def test_every_module_has_a_test_file_of_its_name_or_a_row_in_the_table():
    rows = table()
    assert [module for module in modules() if namesake(module) is None and module not in rows] == []


def test_the_table_names_only_modules_and_test_files_that_exist():
    rows = table()
    assert len(rows) >= 10  # the table was found and read
    assert [module for module in rows if not (REPO / module).is_file()] == []
    assert {module: tests for module, tests in rows.items() if not tests} == {}
    assert sorted({test for tests in rows.values() for test in tests if not (REPO / test).is_file()}) == []


def test_no_module_in_the_table_has_a_test_file_of_its_name():
    assert {module: namesake(module) for module in table() if namesake(module)} == {}
