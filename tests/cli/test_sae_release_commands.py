"""--sae RELEASE/ID in the commands (explain --sae, sae eval, sae features) and `sae releases`, against a loopback hub
serving fake files of SAELens's releases; the expected latents are SAELens's with TransformerLens on the same random
model (tests/fixtures/sae_releases/, scripts/fixtures/make_sae_release_reference.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy.sae.releases import releases
from tests.conftest import REPO, assert_one_error_line
from tests.sae_release_helpers import RELEASE_FIXTURES, hub_layout, reference
from tests.http_server import FileServer

MODEL = RELEASE_FIXTURES / "model"
TEXT = "The cat sat on the mat, and"  # the fixture's tokens, in the model's byte-level vocabulary


@pytest.fixture
def hub(tmp_path):  # -> (env for a command, the models dir): HF_ENDPOINT at a loopback hub of the four releases
    files, published = hub_layout()
    with FileServer(files, published=published) as server:
        yield {**os.environ, "HF_ENDPOINT": server.url, "PYTHONPATH": str(REPO)}, tmp_path / "weights"


def run(module, *args, env, stdin=None):  # -> CompletedProcess of python -m module args
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, env=env,
                          input=stdin, timeout=120, cwd=REPO)


@pytest.mark.slow
def test_explain_sae_release_shows_saelens_latents(hub):
    env, weights = hub
    result = run("gpt2_numpy.explain", TEXT, "--model", MODEL, "--models-dir", weights, "--sae",
                 "gpt2-small-res-jb/blocks.1.hook_resid_pre", "--json", env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    expected = reference()["k0_latents"]
    assert shown["prompt_ids"] == reference()["tokens"].tolist()
    for position, row in enumerate(shown["latents"]):
        for latent in row["top"]:
            assert latent["activation"] == pytest.approx(expected[position, latent["id"]],
                                                         rel=1e-4, abs=1e-4 * float(np.abs(expected).max()))
        assert [latent["id"] for latent in row["top"]] == list(np.argsort(-expected[position], kind="stable")[:5])


@pytest.mark.slow
def test_sae_eval_of_a_release_reports_saelens_metrics_and_the_published_ones(hub):
    env, weights = hub
    result = run("gpt2_numpy", "sae", "eval", "--sae", "gpt2-small-mlp-tm/blocks.1.hook_mlp_out", "--model", MODEL,
                 "--models-dir", weights, "--data", "/dev/stdin", "--seq-len", 8, "--windows", 3, env=env,
                 stdin=TEXT + " the dog")
    assert result.returncode == 0, result.stderr
    listed = releases()["gpt2-small-mlp-tm"]["saes"]["blocks.1.hook_mlp_out"]
    assert f"published in SAELens's list: l0 {listed['l0']:g}  variance explained " \
           f"{listed['variance_explained']:g}" in result.stdout
    assert "CE loss score" in result.stdout and "KL div score" in result.stdout


@pytest.mark.slow
def test_sae_features_of_a_release_links_each_latent_to_neuronpedia(hub, tmp_path):
    env, weights = hub
    result = run("gpt2_numpy", "sae", "features", "--sae", "gpt2-small-res-jb/blocks.1.hook_resid_pre",
                 "--model", MODEL, "--models-dir", weights, "--data", "/dev/stdin", "--seq-len", 8, "--windows", 3,
                 "--latents", 32, "--html", tmp_path / "page.html", env=env, stdin=TEXT + " the dog")
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "page.html").read_text()
    assert '"neuronpedia": "https://www.neuronpedia.org/gpt2-small/1-res-jb/32"' in page


@pytest.mark.slow
def test_an_unknown_release_is_one_error_line_with_the_nearest(hub):
    env, weights = hub
    result = run("gpt2_numpy", "sae", "eval", "--sae", "gpt2-small-res-jbb/blocks.1.hook_resid_pre", "--model", MODEL,
                 "--models-dir", weights, "--data", "/dev/stdin", env=env, stdin=TEXT)
    assert_one_error_line(subprocess.CompletedProcess(result.args, result.returncode, result.stdout, result.stderr),
                          "unknown SAE release 'gpt2-small-res-jbb': the nearest are gpt2-small-res-jb")


@pytest.mark.slow
def test_sae_releases_lists_every_release_and_one_release_s_ids():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    everything = run("gpt2_numpy", "sae", "releases", env=env)
    assert everything.returncode == 0 and len(everything.stdout.splitlines()) == len(releases()) == 18
    one = run("gpt2_numpy", "sae", "releases", "gpt2-small-res-jb", env=env)
    assert "  gpt2-small-res-jb/blocks.8.hook_resid_pre  l0 " in one.stdout
