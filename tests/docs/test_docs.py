"""The docs cannot go stale: every relative link and image of README.md and docs/*.md resolves (a #section too), every
path they name under gpt2_numpy/, tests/, scripts/ or docs/ exists, and every block marked runnable runs.

A fenced block whose info string is `bash run` or `python run` is runnable. README.md's blocks run first, in order, in
an empty folder holding a copy of README.md; its first run trains the tiny model my-gpt there. Each page of docs/ then
runs its blocks in order in a folder of its own, with copies of README.md and my-gpt. `python` is this interpreter and
the package is this checkout; the models dir is empty and downloads go to a closed port on 127.0.0.1, so nothing is
fetched. Each block must exit 0 within BLOCK_SECONDS.
"""
import ast
import fnmatch
import importlib
import inspect
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNERS = {"bash": ["bash", "-e", "-o", "pipefail", "-c"], "python": [sys.executable, "-c"]}
BLOCK_SECONDS = 120  # a block is a few commands on a 2-layer model: seconds each, on a loaded 2-core machine
FENCE = re.compile(r"^\s*(`{3,})(.*)$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<(?:img|a)\s[^>]*?(?:src|href)=\"([^\"]+)\"")
REPO_PATH = re.compile(r"(?<![\w./-])((?:gpt2_numpy|tests|scripts|docs)/[\w./*-]*\w)")


def page_name(page):
    return str(page.relative_to(REPO))


# --- Reading a page ---


def blocks(text):  # -> [(line number, info string, code)] of every fenced block
    found, lines, opened = [], text.splitlines(keepends=True), None
    for number, line in enumerate(lines, start=1):
        match = FENCE.match(line)
        if opened is None and match:
            opened = (number, match.group(1), match.group(2).strip(), [])
        elif opened is not None and match and match.group(1) == opened[1] and not match.group(2).strip():
            found.append((opened[0], opened[2], textwrap.dedent("".join(opened[3]))))
            opened = None
        elif opened is not None:
            opened[3].append(line)
    assert opened is None, f"the block opened at line {opened[0]} is never closed"
    return found


def runnable(text):  # -> [(line number, language, code)] of the blocks marked `bash run` or `python run`
    return [(number, info.split()[0], code) for number, info, code in blocks(text)
            if len(info.split()) == 2 and info.split()[1] == "run" and info.split()[0] in RUNNERS]


def outside_blocks(text):  # -> the lines outside fenced blocks
    kept, inside = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match and (inside is None or match.group(1) == inside):
            inside = match.group(1) if inside is None else None
        elif inside is None:
            kept.append(line)
    return kept


def prose(text):  # -> the text outside fenced blocks and inline code, where links live
    return "\n".join(re.sub(r"`[^`]*`", "", line) for line in outside_blocks(text))


def anchors(text):  # -> the #fragments GitHub gives the page's headings
    seen, found = {}, set()
    for line in outside_blocks(text):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link in a heading keeps its text
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(page, text):  # -> ["target: why"] for each relative link or image that does not resolve
    broken = []
    for match in LINK.finditer(prose(text)):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not ours to check offline
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if path and not resolved.exists():
            broken.append(f"{target}: {resolved} does not exist")
            continue
        if fragment and resolved.suffix == ".md":
            headings = anchors(resolved.read_text(encoding="utf-8") if path else text)
            if fragment not in headings:
                broken.append(f"{target}: {resolved.name} has no heading #{fragment}")
    return broken


# --- Links and paths ---


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_relative_link_and_image_resolves(page):
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_path_named_in_the_repo_exists(page):
    named = set(REPO_PATH.findall(page.read_text(encoding="utf-8")))
    assert sorted(path for path in named if not list(REPO.glob(path))) == []


# what an example needs beyond the core's dependencies -> the install command that the paragraph above it must give
EXTRAS = {"--plot ": 'pip install -e ".[plot]"', "scripts.demo.plot_loss": 'pip install -e ".[plot]"',
          "scripts.demo.screenshot_page": 'pip install -e ".[test]"'}


def paragraph_above(lines, number):  # -> the lines of the paragraph that ends right above line `number` (from 1)
    end = number - 1
    while end > 0 and not lines[end - 1].strip():
        end -= 1
    start = end
    while start > 0 and lines[start - 1].strip():
        start -= 1
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_an_example_that_needs_an_extra_says_its_install_right_above_it(page):
    text = page.read_text(encoding="utf-8")
    missing = [f"{page_name(page)}:{number}: {install}" for number, _, code in blocks(text)
               for needle, install in EXTRAS.items() if needle in code
               and install not in paragraph_above(text.splitlines(), number)]
    assert missing == []


def test_the_link_checker_sees_broken_links_and_sections(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Has `code`, and more!\n\n## Has `code`, and more!\n")
    text = ("[ok](other.md#has-code-and-more) [twice](other.md#has-code-and-more-1) [gone](missing.md) "
            "![pic](pic.png) [bad](other.md#nowhere) [self](#also-nowhere)\n"
            "`[not a link](missing.md)`\n```\n[nor this](missing.md)\n```\n[web](https://example.com)\n")
    assert broken_links(tmp_path / "page.md", text) == [
        f"missing.md: {tmp_path / 'missing.md'} does not exist", f"pic.png: {tmp_path / 'pic.png'} does not exist",
        "other.md#nowhere: other.md has no heading #nowhere", "#also-nowhere: page.md has no heading #also-nowhere"]


# --- Runnable blocks ---


def closed_port():  # -> a port on 127.0.0.1 that nothing listens on: connecting is refused at once
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(tmp_path):  # -> os.environ for the blocks: this interpreter and checkout, no network, no user weights
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `python` runs this interpreter by its own path: a link or a copy of it elsewhere would start without the
    # virtualenv's packages, as a venv's interpreter finds its pyvenv.cfg beside the path it was started by
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n', encoding="utf-8")
    (bin_dir / "python").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO),
            "GPT2_NUMPY_BASE_URL": f"http://127.0.0.1:{closed_port()}", "GPT2_NUMPY_WEIGHTS": str(tmp_path / "weights"),
            "NO_COLOR": "1", "MPLBACKEND": "Agg"}


def run_blocks(name, text, folder, env):  # -> None; fails naming the page, line and output of the first failing block
    for number, language, code in runnable(text):
        try:
            result = subprocess.run([*RUNNERS[language], code], cwd=folder, env=env, capture_output=True, text=True,
                                    stdin=subprocess.DEVNULL, timeout=BLOCK_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}:{number}: the {language} block ran longer than {BLOCK_SECONDS} s:\n{code}")
        if result.returncode != 0:
            pytest.fail(f"{name}:{number}: the {language} block exited with {result.returncode}:\n{code}\n"
                        f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}")


RUNNABLE_DOCS = [page for page in PAGES[1:] if runnable(page.read_text(encoding="utf-8"))]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):  # -> the folder where README.md's blocks ran: it holds my-gpt, the tiny model
    folder = tmp_path_factory.mktemp("readme")
    shutil.copy(REPO / "README.md", folder)
    run_blocks("README.md", (REPO / "README.md").read_text(encoding="utf-8"), folder,
               environment(tmp_path_factory.mktemp("env")))
    return folder


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_blocks_run_and_make_the_tiny_model(first_run):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    python_section = readme[readme.index("## Use it from Python") :].split("\n## ")[0]
    assert [language for _, language, _ in runnable(python_section)] == ["python"]  # it runs as pasted
    assert (first_run / "my-gpt" / "model.safetensors").is_file()  # the offline first run made the tiny model


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_python_block_shows_text_on_the_tiny_model(first_run, tmp_path):
    # greedy decoding of the 20-step model is 20 newlines, which reads as a failure: the block must print more
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    [(_, _, code)] = runnable(readme[readme.index("## Use it from Python") :].split("\n## ")[0])
    recorder = ("import sys, gpt2_numpy\nreal = gpt2_numpy.complete\n"
                "gpt2_numpy.complete = lambda *a, **k: print(repr(real(*a, **k)), file=sys.stderr) or real(*a, **k)\n")
    result = subprocess.run([sys.executable, "-c", recorder + code], cwd=first_run, env=environment(tmp_path),
                            capture_output=True, text=True, timeout=BLOCK_SECONDS)
    assert result.returncode == 0, result.stderr
    completions = [ast.literal_eval(line) for line in result.stderr.splitlines() if line.startswith(("'", '"'))]
    assert completions and all(text.strip() for text in completions), completions


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", RUNNABLE_DOCS, ids=page_name)
def test_the_runnable_blocks_of_each_page_run(page, first_run, tmp_path):
    folder = tmp_path / "page"
    folder.mkdir()
    shutil.copy(REPO / "README.md", folder)
    shutil.copytree(first_run / "my-gpt", folder / "my-gpt")  # a copy: a page may train it further
    run_blocks(page_name(page), page.read_text(encoding="utf-8"), folder, environment(tmp_path))


def test_a_block_runs_this_interpreter_in_its_environment(tmp_path):  # a virtualenv's, with its packages
    code = "python -c 'import sys, pytest; print(sys.prefix); print(pytest.__file__)'"
    result = subprocess.run([*RUNNERS["bash"], code], env=environment(tmp_path), capture_output=True, text=True,
                            timeout=BLOCK_SECONDS)
    assert result.stdout.splitlines() == [sys.prefix, pytest.__file__], result.stderr


def test_a_failing_block_fails_and_only_marked_blocks_run(tmp_path):
    text = ("```bash\nexit 3\n```\n\n```bash run\ntrue\n```\n\n```python run\nprint('ran')\n```\n\n"
            "```bash run\necho before\nfalse\necho after\n```\n")
    assert [(number, language) for number, language, _ in runnable(text)] == [(5, "bash"), (9, "python"), (13, "bash")]
    with pytest.raises(pytest.fail.Exception, match=r"page.md:13: the bash block exited with 1"):
        run_blocks("page.md", text, tmp_path, environment(tmp_path))


@pytest.mark.parametrize("function", ["gpt2_numpy.tokenizer:Tokenizer.textbook_bpe",
                                      "gpt2_numpy.tokenizer:replace_pair",
                                      "gpt2_numpy.tokenizer_train:train_bpe_textbook"])
def test_the_tokenizer_page_prints_the_textbook_code_as_it_is(function):  # as README.md prints model.py
    module_name, qualified = function.split(":")
    target = importlib.import_module(module_name)
    for part in qualified.split("."):
        target = getattr(target, part)
    listings = [code for _, info, code in blocks((REPO / "docs" / "tokenizer.md").read_text(encoding="utf-8"))
                if info == "python"]
    assert textwrap.dedent(inspect.getsource(target)) in listings


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_says_what_greedy_decoding_of_the_tiny_model_writes(first_run):
    # the README once said "20 blank lines" where the model wrote 20 spaces
    from gpt2_numpy import complete, load_model

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    claim = re.search(r'greedy \(the default\) repeats the likeliest token: for the 20-step model, ("[^"]*") 20 times',
                      readme)
    assert claim, "the README's Python block no longer says what greedy decoding writes"
    assert complete(load_model(first_run / "my-gpt"), "The model", n_tokens=20) == ast.literal_eval(claim[1]) * 20


# --- Following the docs leaves a clone clean ---

WRITES = re.compile(r"(?:--out|--html|--plot|--screenshot|-o|>)\s+([^\s`'\"]+)")  # a command's output path
PLACEHOLDER = re.compile(r"^(?:OUT|DIR|FILE|PNG)(?:$|[-/])")  # the reader's own name: OUT, OUT-sae/sae


def written_paths(text):  # -> the paths the commands of a page's shell blocks write, relative to where they run
    return sorted({path for _, info, code in blocks(text) if info.split()[:1] in (["bash"], ["console"], ["sh"])
                   for path in WRITES.findall(code)
                   if not PLACEHOLDER.match(path) and not path.startswith(("../", "/", "~"))})


def ignored(path, gitignore):  # -> whether .gitignore's lines ignore path, written from the root of a clone
    patterns = [line.strip("/") for line in gitignore.splitlines() if line and not line.startswith(("#", "!"))]
    return any(fnmatch.fnmatch(path.rstrip("/"), pattern) or fnmatch.fnmatch(path.split("/")[0], pattern)
               for pattern in patterns)


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_following_the_docs_from_a_clone_writes_only_ignored_files(page):
    # docs/sae.md once had a demo write docs/sae-features.png, a tracked file, and left my-sae/ and features.html
    gitignore = (REPO / ".gitignore").read_text(encoding="utf-8")
    assert [path for path in written_paths(page.read_text(encoding="utf-8")) if not ignored(path, gitignore)] == []


def test_the_written_paths_are_found_and_a_tracked_one_is_not_ignored():
    text = ("```bash\npython -m x --out my-sae --html features.html --plot FILE\npython -m y --screenshot "
            "docs/sae-features.png > samples.jsonl\ncurl -o ../elsewhere.txt URL\n```\n--out prose.txt\n")
    assert written_paths(text) == ["docs/sae-features.png", "features.html", "my-sae", "samples.jsonl"]
    assert not ignored("docs/sae-features.png", "/my-sae/\n/features.html\n# docs/\n")
    assert ignored("my-sae", "/my-sae/\n") and ignored("weights/124M", "weights/*\n")
