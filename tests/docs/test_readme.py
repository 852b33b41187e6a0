"""The README's listing of model.py is the file itself, so the text a reader follows cannot drift from the code."""
from pathlib import Path

import gpt2_numpy.model

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_prints_model_py_whole():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## The model in one file") :]
    listing = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 10)]
    assert listing == Path(gpt2_numpy.model.__file__).read_text(encoding="utf-8")
