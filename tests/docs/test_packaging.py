"""The package's declared license: an SPDX expression, as setuptools 77 and later read it (PEP 639; the TOML table
form is deprecated and stops building in 2027), and the license files it names, which every wheel carries in its
metadata. Read from pyproject.toml's text, so that the oldest claimed Python, without tomllib, checks it too. And what
an installed package holds: the README's offline first run works from it, in a folder with no clone around."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs.test_docs import BLOCK_SECONDS, environment, runnable

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


# --- The offline first run from an installed package, not a clone ---


def package_data():  # -> {package: [file names]} of pyproject.toml's [tool.setuptools.package-data]
    table = PYPROJECT.split("\n[tool.setuptools.package-data]\n", 1)[1].split("\n[", 1)[0]
    return {package: re.findall(r'"([^"]+)"', names)
            for package, names in re.findall(r'^"?([\w.]+)"? = \[([^\]]*)\]', table, re.MULTILINE)}


def install_copy(site):  # -> None: site holds gpt2_numpy as a wheel lays it out, its modules and declared data only
    modules = [path.relative_to(REPO) for path in (REPO / "gpt2_numpy").rglob("*.py")]
    data = [Path(package.replace(".", "/"), name) for package, names in package_data().items() for name in names]
    for path in modules + data:
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, site / path)


def test_the_declared_package_data_is_what_the_package_reads():
    declared = package_data()
    assert "data/sample.txt" in declared["gpt2_numpy"]  # `--data sample:`, the first run's text
    assert "page.html" in declared["gpt2_numpy.interpret"] and "features.html" in declared["gpt2_numpy.sae"]
    assert "graph.html" in declared["gpt2_numpy.circuits"]  # circuits graph's page


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_offline_first_run_works_from_an_installed_package_anywhere(tmp_path):
    # the README's first run, then what the package's own messages tell a user offline to do, run in an empty folder
    # with the package installed elsewhere: no README.md, no docs/ beside it
    site, anywhere = tmp_path / "site-packages", tmp_path / "anywhere"
    install_copy(site)
    anywhere.mkdir()
    env = {**environment(tmp_path), "PYTHONPATH": str(site)}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    [(_, _, first_run)] = runnable(readme[readme.index("## A first run, offline"):].split("\n## ")[0])

    def run(command):  # -> the finished bash command, run where no clone is
        return subprocess.run(["bash", "-e", "-c", command], cwd=anywhere, env=env, capture_output=True, text=True,
                               timeout=BLOCK_SECONDS)

    where = run("python -c 'import gpt2_numpy; print(gpt2_numpy.__file__)'")
    assert where.stdout.strip() == str(site / "gpt2_numpy" / "__init__.py"), where.stderr
    result = run(first_run)
    assert result.returncode == 0, result.stderr[-3000:]
    offline = run('python -m gpt2_numpy.generate "Hello"')  # no weights, no network: the message says what to do
    assert offline.returncode != 0
    [command] = re.findall(r"\((gpt2-numpy train [^)]*)\)", offline.stderr)
    suggested = run(command.replace("gpt2-numpy", "python -m gpt2_numpy", 1).replace("my-gpt", "suggested-gpt"))
    assert suggested.returncode == 0, suggested.stderr[-3000:]
    no_text = run('python -m gpt2_numpy.explain --model my-gpt "The cat" --ablate 0.1 --ablation mean')
    [mean_over] = re.findall(r"add --mean-over (\S+)", no_text.stderr)
    mean = run(f'python -m gpt2_numpy.explain --model my-gpt "The cat" --ablate 0.1 --ablation mean '
               f"--mean-over {mean_over}")
    assert mean.returncode == 0 and "Ablation of head 0.1" in mean.stdout, mean.stderr
