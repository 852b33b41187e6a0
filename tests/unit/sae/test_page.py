"""sae features --html: the page's data against the SAE and the model run here, and the page itself in headless
Chromium (the attention page's browser, network cut off): every latent's contexts with each token's activation, the
histogram's bars, the promoted and suppressed tokens; and a text holding </script><script> or <img onerror=...> shown
as text, running nothing, with nothing fetched."""
import json
import re

import numpy as np
import pytest

from gpt2_numpy.sae.features import context_span, logit_effects
from gpt2_numpy.sae.page import TOP_TOKENS, features_data, features_html
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.params import random_params
from tests.sae_helpers import random_sae
from tests.unit.test_page import browser  # noqa: F401  (the fixture: headless Chromium, offline)

HPARAMS = {"n_vocab": 40, "n_ctx": 16, "n_embd": 16, "n_head": 4, "n_layer": 2}
# texts a page that pasted them in as HTML would run, or that would end the script holding the data
TRICKY = {0: "</script><script>window.pwned = 1</script>", 1: '<img src=x onerror="window.pwned = 2">',
          2: "a & b &amp; <!--", 3: "\n"}
N_SEQ = 12  # a context shows up to 12 tokens before its peak: every context starts at the window's first token


def text_of(token_id):
    return TRICKY.get(token_id, f" w{token_id}")


def shown_text(text):  # the page shows line breaks and tabs as arrows
    return text.replace("\n", "\u21b5").replace("\t", "\u21e5")


@pytest.fixture(scope="module")
def case(tmp_path_factory):  # -> params, sae, windows, latents, activations [n_windows, n_seq, d_sae], page path
    params = random_params(HPARAMS, 4)
    sae = random_sae(16, 24, "blocks.0.out", seed=8)
    rng = np.random.default_rng(2)
    windows = rng.integers(4, 40, (6, N_SEQ))
    windows[:, :4] = [0, 1, 2, 3]  # the tricky texts in every context
    acts = np.stack([sae.encode(trace(w, params, HPARAMS["n_head"])["blocks.0.out"]) for w in windows])
    latents = [int(latent) for latent in np.argsort(-(acts > 0).sum(axis=(0, 1)), kind="stable")[:3]]
    data = features_data(windows, params, HPARAMS["n_head"], sae, latents, text_of, "a test page", n_contexts=4)
    path = tmp_path_factory.mktemp("page") / "features.html"
    path.write_text(features_html(data), encoding="utf-8")
    return params, sae, windows, latents, acts, path


def page_data(path):  # -> the JSON the page's script holds
    return json.loads(re.search(r"const DATA = (.*);\n", path.read_text(encoding="utf-8")).group(1))


def expected_contexts(acts, windows, latent, count):  # -> [(window, position)] of the strongest activations
    values = acts[..., latent]
    order = sorted(((-values[w, p], w, p) for w in range(len(windows)) for p in range(N_SEQ)))[:count]
    return [(w, p) for value, w, p in order if value < 0]


# --- The data, without a browser ---


def test_the_page_holds_each_latent_s_strongest_contexts_token_by_token(case):
    params, sae, windows, latents, acts, path = case
    data = page_data(path)
    assert [latent["id"] for latent in data["latents"]] == latents
    assert data["positions"] == windows.size
    for latent in data["latents"]:
        contexts = expected_contexts(acts, windows, latent["id"], 4)
        assert len(latent["contexts"]) == len(contexts) > 0
        for context, (window, position) in zip(latent["contexts"], contexts):
            start, stop = context_span(position, N_SEQ)
            assert context["tokens"] == [text_of(t) for t in windows[window, start:stop]]
            np.testing.assert_allclose(context["acts"], acts[window, start:stop, latent["id"]], rtol=1e-6)
            assert context["tokens"][context["peak"]] == text_of(windows[window, position])
        values = acts[..., latent["id"]]
        assert latent["fired"] == (values > 0).sum()
        assert latent["max"] == pytest.approx(values.max())
        assert sum(latent["histogram"]["counts"]) == latent["fired"]


def test_the_page_holds_each_latent_s_promoted_and_suppressed_tokens(case):
    params, sae, _, latents, _, path = case
    promoted, suppressed = logit_effects(sae, params, latents, TOP_TOKENS)
    for latent, up, down in zip(page_data(path)["latents"], promoted, suppressed):
        assert latent["promoted"] == [[text_of(t), pytest.approx(e)] for t, e in up]
        assert latent["suppressed"] == [[text_of(t), pytest.approx(e)] for t, e in down]


def test_the_page_is_self_contained_and_its_data_cannot_end_its_script(case):
    html = case[-1].read_text(encoding="utf-8")
    data = re.search(r"const DATA = (.*);\n", html).group(1)
    assert "<" not in data  # so no text of the user's can end the script or open a tag
    page = html.replace(data, "")
    assert not re.search(r"https?://|//cdn|<link|\bsrc=|@import|url\(|fetch\(|XMLHttpRequest|<img", page)
    assert html.count("<script") == 1 and html.count("</script>") == 1  # the context's "</script>" came in escaped


@pytest.fixture(scope="module")
def q_page(tmp_path_factory):  # -> (data, page path) of an SAE at attn.q, whose latents write nothing the logits read
    params = random_params(HPARAMS, 4)
    sae = random_sae(16, 24, "blocks.1.attn.q", seed=9)
    windows = np.random.default_rng(3).integers(4, 40, (2, N_SEQ))
    data = features_data(windows, params, HPARAMS["n_head"], sae, [0, 1], text_of, "q", n_contexts=2)
    path = tmp_path_factory.mktemp("q") / "features.html"
    path.write_text(features_html(data), encoding="utf-8")
    return data, path


def test_an_sae_the_logits_do_not_read_gets_a_page_without_the_logit_table(q_page):
    # it raised "writes nothing the logits read directly" instead of drawing the contexts and histograms
    data, _ = q_page
    assert data["no_logits"].startswith("an SAE at blocks.1.attn.q writes nothing the logits read directly")
    assert "No logit table: an SAE at blocks.1.attn.q" in data["summary"]
    assert [(latent["promoted"], latent["suppressed"]) for latent in data["latents"]] == [(None, None)] * 2


# --- In a browser ---


@pytest.fixture(scope="module")
def opened(browser, case):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")
    browser.get_log("performance")
    browser.get(case[-1].as_uri())
    WebDriverWait(browser, 30).until(lambda driver: driver.execute_script("return document.body.dataset.ready"))
    return browser


def test_every_context_shows_its_tokens_as_text_shaded_by_activation(opened, case):
    _, _, windows, latents, acts, _ = case
    for latent in latents:
        rows = opened.execute_script(f"""
            return [...document.querySelectorAll('#latent-{latent} .context')].map(row =>
              [...row.querySelectorAll('.token')].map(t => [t.textContent, +t.dataset.act, t.className,
                                                             getComputedStyle(t).backgroundColor]));""")
        contexts = expected_contexts(acts, windows, latent, 4)
        assert len(rows) == len(contexts)
        for row, (window, position) in zip(rows, contexts):
            start, stop = context_span(position, N_SEQ)
            assert [text for text, _, _, _ in row] == [shown_text(text_of(t)) for t in windows[window, start:stop]]
            np.testing.assert_allclose([act for _, act, _, _ in row], acts[window, start:stop, latent], atol=5e-4)
            assert [kind == "token peak" for _, _, kind, _ in row] == [i == position for i in range(start, stop)]
            blue = [int(re.findall(r"\d+", colour)[2]) for _, _, _, colour in row]
            values = acts[window, start:stop, latent]
            assert np.corrcoef(blue, values)[0, 1] < -0.99  # white at 0, orange at the latent's largest activation


def test_the_histogram_draws_each_bin_s_count(opened, case):
    _, _, _, latents, acts, _ = case
    for latent in latents:
        bars = opened.execute_script(f"""
            return [...document.querySelectorAll('#latent-{latent} .bar')].map(b =>
              [+b.dataset.count, b.getBoundingClientRect().height]);""")
        values = acts[..., latent]
        counts, _ = np.histogram(values[values > 0], bins=20, range=(0, values.max()))
        assert [count for count, _ in bars] == counts.tolist()
        heights = np.array([height for _, height in bars])
        np.testing.assert_allclose(heights, counts / counts.max() * heights.max(), atol=1.0)


def test_the_logit_table_shows_the_promoted_and_suppressed_tokens(opened, case):
    params, sae, _, latents, _, _ = case
    promoted, suppressed = logit_effects(sae, params, latents, TOP_TOKENS)
    for latent, up, down in zip(latents, promoted, suppressed):
        for kind, expected in (("promoted", up), ("suppressed", down)):
            shown = opened.execute_script(
                f"return [...document.querySelectorAll('#latent-{latent} td.{kind}')].map(c => c.textContent)")
            assert shown == [f'"{shown_text(text_of(t))}"' for t, _ in expected]


def test_hostile_text_runs_nothing_and_nothing_is_fetched(opened):
    assert opened.execute_script("return window.pwned") is None
    assert opened.execute_script("return document.querySelectorAll('img, iframe, object, embed').length") == 0
    assert opened.execute_script("return document.scripts.length") == 1
    shown = opened.execute_script("return document.body.textContent")
    assert "<img src=x onerror=" in shown and "</script><script>window.pwned = 1</script>" in shown
    assert opened.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert [entry for entry in opened.get_log("browser") if entry["level"] == "SEVERE"] == []
    events = [json.loads(entry["message"])["message"] for entry in opened.get_log("performance")]
    assert [e for e in events if e["method"] == "Network.requestWillBeSent"
            and not e["params"]["request"]["url"].startswith("file:")] == []


def test_a_page_without_logits_says_why_in_place_of_the_table(browser, q_page):  # noqa: F811
    # last: it moves the browser off the page the tests above share
    from selenium.webdriver.support.ui import WebDriverWait

    data, path = q_page
    browser.get(path.as_uri())
    WebDriverWait(browser, 30).until(lambda driver: driver.execute_script("return document.body.dataset.ready"))
    notes = browser.execute_script("return [...document.querySelectorAll('.no-logits')].map(n => n.textContent)")
    assert notes == [f"no logit table: {data['no_logits']}"] * 2
    assert browser.execute_script("return document.querySelectorAll('table.logits').length") == 0


def test_a_context_shows_12_tokens_before_its_peak_and_4_after_within_the_window():
    # CONTEXT_BEFORE, CONTEXT_AFTER = 12, 4: tokens 8 .. 24 around position 20 (the peak and 4 after it), cut at the
    # window's ends
    assert context_span(20, 100) == (8, 25)
    assert context_span(2, 5) == (0, 5)
    assert context_span(2, 7) == (0, 7)
