"""The package's declared license: an SPDX expression, as setuptools 77 and later read it (PEP 639; the TOML table
form is deprecated and stops building in 2027), and the license files it names, which every wheel carries in its
metadata. Read from pyproject.toml's text, so that the oldest claimed Python, without tomllib, checks it too."""
import re

from tests.conftest import REPO

PYPROJECT = (REPO / "pyproject.toml").read_text(encoding="utf-8")


def project_value(key):  # -> the text after `key = ` on its own line of pyproject.toml's [project] table
    table = PYPROJECT.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    found = re.search(rf"^{re.escape(key)} = (.+?)(?:  #.*)?$", table, re.MULTILINE)
    assert found, f"pyproject.toml's [project] has no {key}"
    return found[1]


def test_the_license_is_an_spdx_expression_that_the_required_setuptools_reads():
    assert project_value("license") == '"MIT"'  # a string, not { text = "MIT" }
    required = re.search(r'^requires = \["setuptools>=(\d+)', PYPROJECT, re.MULTILINE)
    assert required and int(required[1]) >= 77  # the first setuptools that reads license as an expression


def test_the_license_files_exist_and_say_what_is_declared():
    named = re.findall(r'"([^"]+)"', project_value("license-files"))
    assert "LICENSE" in named
    for name in named:
        assert (REPO / name).is_file(), name
    ours = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert ours.startswith("MIT License\n\nCopyright (c) the gpt2_numpy authors\n")
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in ours
