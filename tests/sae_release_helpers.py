"""A loopback hub serving the fake release files of tests/fixtures/sae_releases/ where the hub keeps them, and the
random model SAELens and TransformerLens read them with (scripts/fixtures/make_sae_release_reference.py wrote both)."""
import hashlib
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.sae.releases import hub_files, releases
from tests.conftest import FIXTURES
from tests.http_server import FileServer

RELEASE_FIXTURES = FIXTURES / "sae_releases"
N_HEAD = 4
KINDS = (("gpt2-small-res-jb", "blocks.1.hook_resid_pre"), ("gpt2-small-resid-post-v5-32k", "blocks.0.hook_resid_post"),
         ("gpt2-small-mlp-tm", "blocks.1.hook_mlp_out"), ("gpt2-small-hook-z-kk", "blocks.1.hook_z"))


def reference():  # -> SAELens and TransformerLens's arrays
    return np.load(RELEASE_FIXTURES / "reference.npz")


def model_params():  # -> the random model's params
    return load_params(RELEASE_FIXTURES / "model", n_tokens=257)[1]


def kind_files(i):  # -> {repo path: fixture file} of kind i, as the script named them
    release, sae_id = KINDS[i]
    entry = releases()[release]
    cfg, weights = hub_files(entry, entry["saes"][sae_id])
    folder = RELEASE_FIXTURES / f"k{i}"
    return {cfg: folder / "cfg.json", weights: folder / ("weights.pt" if weights.endswith(".pt") else
                                                         "sae_weights.safetensors")}


def url_path(repo, path):  # -> the resolve URL's path of a repo file, as the hub serves it
    return f"/{repo}/resolve/main/{urllib.parse.quote(path)}"


def hub_layout(kinds=range(len(KINDS))):  # -> ({URL path: bytes}, {URL path: (sha256, size)}) of the kinds' files
    files, published = {}, {}
    for i in kinds:
        repo = releases()[KINDS[i][0]]["repo"]
        for path, file in kind_files(i).items():
            data = Path(file).read_bytes()
            files[url_path(repo, path)] = data
            if not path.endswith("json"):  # the hub keeps weights in LFS, and publishes their hash and size
                published[url_path(repo, path)] = (hashlib.sha256(data).hexdigest(), len(data))
    return files, published


@contextmanager
def loopback_hub(monkeypatch, weights, kinds=range(len(KINDS)), **options):  # -> FileServer HF_ENDPOINT points at
    files, published = hub_layout(kinds)
    with FileServer(files, published={**published, **options.pop("published", {})}, **options) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("GPT2_NUMPY_WEIGHTS", str(weights))
        yield server
