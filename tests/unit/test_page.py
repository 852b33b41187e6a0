"""explain --html: the page's data against trace and logit_lens, and the page itself in headless Chromium driven by
selenium: tokens in order, the pickers, the weights shown after clicks and picker changes, the heads' maps, the lens
panel, escaping, no console error and no network request (the network is cut off), up to 1024 tokens; then the
command line's bad input."""
import base64
import json
import os
import re
import shutil
import zlib

import numpy as np
import pytest

from gpt2_numpy.explain import logit_lens, trace
from gpt2_numpy.interpret.heads import PATTERNS, head_scores, repeat_length, repeated_tokens
from gpt2_numpy.interpret.present import heads_json
from gpt2_numpy.interpret.page import WEIGHT_SCALE, page_html
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES, assert_one_error_line, byte_model_dir, run_explain, tiny_models_dir

INSTALL = "apt-get install chromium chromium-driver; pip install selenium"
SHOWN_TOLERANCE = 0.5 / WEIGHT_SCALE + 1e-6  # weights are shown rounded to 3 decimals
PROMPT = "I will go to it, and he is in the"
# tokens whose text would break a page that pasted it in as HTML, or end the script holding the data
TRICKY = {0: "</script><b>bold?</b>", 1: "a & b &amp;", 2: "\n", 3: ' "quoted" ', 4: "\\xe2", 5: "<!--"}


def text_of(token_id):  # a stand-in tokenizer's text for every id: plain words, and the tricky ones
    return TRICKY.get(token_id, f" w{token_id}")


def shown_text(text):  # the page shows line breaks and tabs as arrows
    return text.replace("\n", "\u21b5").replace("\t", "\u21e5")


@pytest.fixture(scope="module")
def model_case():  # -> hparams, params, ids, trace, lens: "five_heads" (3 layers of 5 heads), 37 tokens
    reference = np.load(FIXTURES / "reference_trace_five_heads.npz")
    hparams = json.loads(str(reference["hparams"]))
    params = random_params(hparams, int(reference["seed"]))
    ids = [0, 1, 2, 3, 4, 5, *reference["inputs"][6:].tolist()]
    return hparams, params, ids, trace(ids, params, hparams["n_head"]), logit_lens(ids, params, hparams["n_head"])


@pytest.fixture(scope="module")
def repeated(model_case):  # -> <|endoftext|> R R, with <|endoftext|> as the vocabulary's last id
    hparams = model_case[0]
    return repeated_tokens(hparams["n_vocab"], hparams["n_vocab"] - 1, repeat_length(hparams["n_ctx"]), 0)


@pytest.fixture(scope="module")
def page_path(model_case, repeated, tmp_path_factory):
    hparams, params, ids, _, _ = model_case
    path = tmp_path_factory.mktemp("page") / "page.html"
    path.write_text(page_html(ids, params, hparams["n_head"], text_of, "a test page", repeated), encoding="utf-8")
    return path


def page_data(path):  # -> the JSON the page's script holds
    html = path.read_text(encoding="utf-8")
    return json.loads(re.search(r"const DATA = (.*);\n", html).group(1))


def unpack_weights(data):  # -> float [n_layer, n_head, n_seq, n_seq], decoded here as page.py's docstring says
    words = np.frombuffer(zlib.decompress(base64.b64decode(data["weights"])), "<u2")
    n_seq = len(data["ids"])
    n_rows = data["n_layer"] * data["n_head"] * n_seq
    counts = words[:n_rows].astype(int)
    n_stored = counts.sum()
    gaps, values = words[n_rows : n_rows + n_stored], words[n_rows + n_stored :]
    assert len(values) == n_stored
    weights = np.zeros((n_rows, n_seq))
    stored = 0
    for row, count in enumerate(counts):
        keys = np.cumsum(gaps[stored : stored + count].astype(int) + 1) - 1
        weights[row, keys] = values[stored : stored + count] / data["scale"]
        stored += count
    return weights.reshape(data["n_layer"], data["n_head"], n_seq, n_seq)


# --- The data, without a browser ---


def test_the_page_holds_every_head_s_weights_to_3_decimals(model_case, page_path):
    hparams, _, ids, names, _ = model_case
    weights = np.stack([names[f"blocks.{i}.attn.weights"] for i in range(hparams["n_layer"])])
    unpacked = unpack_weights(page_data(page_path))
    assert np.abs(unpacked - weights).max() <= SHOWN_TOLERANCE
    assert (unpacked[..., np.triu(np.ones((len(ids), len(ids)), bool), 1)] == 0).all()


def test_the_page_holds_the_lens_top_tokens_layer_by_layer(model_case, page_path):
    hparams, _, ids, _, lens = model_case
    data = page_data(page_path)
    assert len(data["lens"]) == hparams["n_layer"] + 1
    for layer, rows in enumerate(data["lens"]):
        for position, top in enumerate(rows):
            expected = np.argsort(-lens[layer, position], kind="stable")[: len(top)]
            assert [token_id for token_id, _ in top] == expected.tolist()
            np.testing.assert_allclose([p / 1000 for _, p in top], np.exp(lens[layer, position, expected]),
                                       atol=0.0005 + 1e-6)
    assert all(data["texts"][str(token_id)] == text_of(token_id) for token_id in ids)


def test_the_page_is_self_contained(page_path):
    html = page_path.read_text(encoding="utf-8")
    assert not re.search(r"https?://|//cdn|<link|\bsrc=|@import|url\(|fetch\(|XMLHttpRequest", html)
    assert html.count("<script") == 1 and html.count("</script>") == 1  # the token "</script>" came in escaped


# --- In a browser ---


def missing_browser():  # -> what is missing to run the browser tests, or None
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium"
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        return "chromium"
    if not shutil.which("chromedriver"):
        return "chromedriver"
    return None


@pytest.fixture(scope="module")
def browser():  # headless Chromium with the network cut off; fails under CI=true when missing, skips otherwise
    missing = missing_browser()
    if missing:
        message = f"the browser tests need {missing}: {INSTALL}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--proxy-server=127.0.0.1:9"]:  # no proxy there: nothing gets out
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions",
                           {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    yield driver
    driver.quit()


def open_page(browser, path):  # -> None, once the page has unpacked its weights
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")  # drop what earlier pages logged
    browser.get_log("performance")
    browser.get(path.as_uri())
    WebDriverWait(browser, 60).until(lambda driver: driver.execute_script("return document.body.dataset.ready"))


def choose(browser, picker, value):
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", picker)).select_by_value(str(value))


def shown_weights(browser):  # -> [(index, data-weight, text)] of every token element, in document order
    return browser.execute_script(
        "return [...document.querySelectorAll('[data-token-index]')]"
        ".map(e => [+e.dataset.tokenIndex, e.dataset.weight, e.textContent])")


def click_token(browser, index):
    browser.find_element("css selector", f'[data-token-index="{index}"]').click()


@pytest.fixture(scope="module")
def opened(browser, page_path):
    open_page(browser, page_path)
    return browser


def test_tokens_are_shown_in_order_with_their_indices_and_text(opened, model_case):
    _, _, ids, _, _ = model_case
    shown = shown_weights(opened)
    assert [index for index, _, _ in shown] == list(range(len(ids)))
    assert [text for _, _, text in shown] == [shown_text(text_of(token_id)) for token_id in ids]  # literally


def test_the_pickers_offer_every_layer_and_head(opened, model_case):
    hparams = model_case[0]
    for picker, count in [("layer", hparams["n_layer"]), ("head", hparams["n_head"])]:
        values = opened.execute_script(
            f"return [...document.querySelectorAll('select#{picker} option')].map(o => o.value)")
        assert values == [str(n) for n in range(count)]


@pytest.mark.parametrize("layer, head, query", [(0, 0, 0), (1, 3, 20), (2, 4, 36), (2, 1, 7), (0, 2, 36)])
def test_clicked_tokens_show_the_query_s_weights_of_the_chosen_head(opened, model_case, layer, head, query):
    _, _, ids, names, _ = model_case
    choose(opened, "layer", layer)
    choose(opened, "head", head)
    click_token(opened, query)
    expected = names[f"blocks.{layer}.attn.weights"][head, query]
    shown = shown_weights(opened)
    weights = np.array([float(weight) for _, weight, _ in shown])
    assert all(len(weight.split(".")[1]) >= 3 for _, weight, _ in shown)
    assert np.abs(weights - expected).max() <= SHOWN_TOLERANCE
    assert (weights[query + 1 :] == 0).all()
    assert opened.find_element("css selector", f'[data-token-index="{query}"]').get_attribute("class") == "token query"


def test_changing_layer_or_head_keeps_the_query_and_updates_the_weights(opened, model_case):
    _, _, _, names, _ = model_case
    choose(opened, "layer", 0)
    click_token(opened, 30)
    for layer, head in [(2, 0), (2, 3), (1, 3)]:  # the head, then the layer, changed after the click
        choose(opened, "layer", layer)
        choose(opened, "head", head)
        weights = np.array([float(weight) for _, weight, _ in shown_weights(opened)])
        assert np.abs(weights - names[f"blocks.{layer}.attn.weights"][head, 30]).max() <= SHOWN_TOLERANCE


def test_the_layer_s_heads_are_drawn_side_by_side_and_a_map_chooses_its_head(opened, model_case):
    hparams, _, _, names, _ = model_case
    choose(opened, "layer", 1)
    maps = opened.find_elements("css selector", "#heads .map canvas")
    assert len(maps) == hparams["n_head"]
    # each map's first column holds every query's weight on the first token: darker where that weight is larger
    column = opened.execute_script("""
        return [...document.querySelectorAll('#heads .map canvas')].map(canvas => {
          const data = canvas.getContext('2d').getImageData(0, 0, 1, canvas.height).data;
          return Array.from({length: canvas.height}, (_, y) => data[4 * y]);
        });""")
    for head, reds in enumerate(column):
        first = names["blocks.1.attn.weights"][head, :, 0]
        assert np.corrcoef(reds, first)[0, 1] < -0.9  # red falls as the weight grows (white to blue)
    click_token(opened, 12)
    opened.find_elements("css selector", "#heads .map")[3].click()
    assert opened.find_element("id", "head").get_attribute("value") == "3"
    weights = np.array([float(weight) for _, weight, _ in shown_weights(opened)])
    assert np.abs(weights - names["blocks.1.attn.weights"][3, 12]).max() <= SHOWN_TOLERANCE


def test_the_lens_panel_shows_the_clicked_position_layer_by_layer(opened, model_case):
    hparams, _, ids, _, lens = model_case
    for position in (4, len(ids) - 1):
        click_token(opened, position)
        rows = opened.execute_script(
            "return [...document.querySelectorAll('#lens tr')].slice(1).map(r => [...r.cells].map(c => "
            "[c.firstChild.textContent, c.className, c.querySelector('.p') && c.querySelector('.p').textContent]))")
        assert [row[0][0] for row in rows] == ["embed", *map(str, range(hparams["n_layer"]))]
        for layer, row in enumerate(rows):
            top = np.argsort(-lens[layer, position], kind="stable")[: len(row) - 1]
            assert [cell[0] for cell in row[1:]] == [f'"{shown_text(text_of(t))}"' for t in top]
            assert abs(float(row[1][2]) - np.exp(lens[layer, position, top[0]])) <= 0.0005 + 1e-6
            next_id = ids[position + 1] if position + 1 < len(ids) else None
            assert [cell[1] == "hit" for cell in row[1:]] == [t == next_id for t in top]


def test_no_console_error_and_no_network_request(browser, page_path):
    open_page(browser, page_path)
    click_token(browser, 3)
    choose(browser, "layer", 2)
    choose(browser, "head", 4)
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    requested = [event["params"]["request"]["url"] for event in events
                 if event["method"] == "Network.requestWillBeSent"]
    assert requested == [page_path.as_uri()]  # the page itself, and nothing else


def test_an_error_in_the_page_would_be_seen(browser, tmp_path):  # the console check above can fail
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "broken.html"
    path.write_text("<!DOCTYPE html><title>x</title><script>undefinedFunction();</script>", encoding="utf-8")
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(path.as_uri())
    seen = []  # get_log hands each entry over once: every poll's are kept

    def page_error(driver):  # -> the SEVERE entries naming the page's error so far
        seen.extend(driver.get_log("browser"))
        return [entry for entry in seen if entry["level"] == "SEVERE" and "undefinedFunction" in entry["message"]]

    WebDriverWait(browser, 30, poll_frequency=0.1).until(page_error)  # on a loaded machine the entry comes late


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_page_of_1024_tokens_works(browser, tmp_path):
    hparams = {"n_vocab": 512, "n_ctx": 1024, "n_embd": 32, "n_head": 4, "n_layer": 2}
    params = random_params(hparams, 5)
    ids = np.random.default_rng(5).integers(0, hparams["n_vocab"], 1024).tolist()
    path = tmp_path / "long.html"
    path.write_text(page_html(ids, params, hparams["n_head"], text_of, "long"), encoding="utf-8")
    names = trace(ids, params, hparams["n_head"])
    open_page(browser, path)
    assert len(shown_weights(browser)) == 1024
    for layer, head, query in [(1, 2, 1023), (0, 3, 511)]:
        choose(browser, "layer", layer)
        choose(browser, "head", head)
        browser.execute_script(f"document.querySelector('[data-token-index=\"{query}\"]').click()")
        weights = np.array([float(weight) for _, weight, _ in shown_weights(browser)])
        assert np.abs(weights - names[f"blocks.{layer}.attn.weights"][head, query]).max() <= SHOWN_TOLERANCE


# --- Issue 29 and 31: a hint that stays, shading relative to the row's largest weight, its legend, the head scores,
# the largest weight in each pixel of a map ---


def token_colours(browser):  # -> [(data-weight, [r, g, b] of the background)] of every token element
    return [(float(weight), [int(c) for c in re.findall(r"\d+", colour)[:3]]) for weight, colour in
            browser.execute_script("return [...document.querySelectorAll('[data-token-index]')]"
                                   ".map(e => [e.dataset.weight, getComputedStyle(e).backgroundColor])")]


def shaded(share):  # -> the page's white-to-blue colour of a share from 0 to 1 (rgb(9, 105, 218) at 1)
    return [int(np.floor(white + (blue - white) * share + 0.5)) for white, blue in zip((255, 255, 255), (9, 105, 218))]


@pytest.fixture
def reopened(browser, page_path):  # the 37-token page, opened afresh: tests before may have opened other pages
    open_page(browser, page_path)
    return browser


def test_the_hint_and_the_legend_stay_visible_after_a_click(reopened):
    opened = reopened
    click_token(opened, 20)
    hint = opened.find_element("id", "hint")
    assert hint.is_displayed() and "Click a token" in hint.text
    legend = opened.find_element("id", "legend")
    largest = max(weight for weight, _ in token_colours(opened))
    assert legend.is_displayed() and f"full colour: {largest:.3f}, the query's largest weight" in legend.text


@pytest.mark.parametrize("layer, head, query", [(0, 1, 36), (2, 3, 9)])
def test_tokens_are_shaded_relative_to_the_query_s_largest_weight(reopened, layer, head, query):
    opened = reopened
    choose(opened, "layer", layer)
    choose(opened, "head", head)
    click_token(opened, query)
    colours = token_colours(opened)
    largest = max(weight for weight, _ in colours)
    for weight, colour in colours:
        assert np.abs(np.subtract(colour, shaded(weight / largest))).max() <= 1, (weight, largest, colour)


@pytest.fixture(scope="module")
def weak_page(tmp_path_factory):  # -> a page of 120 tokens whose heads spread their weight nearly evenly
    hparams = {"n_vocab": 300, "n_ctx": 128, "n_embd": 32, "n_head": 2, "n_layer": 1}
    params = random_params(hparams, 9)
    params["blocks"][0]["attn"]["c_attn"]["w"] *= 0.01  # scores near 0: each query's weights near 1 / (i + 1)
    ids = np.random.default_rng(9).integers(6, 300, 120).tolist()
    path = tmp_path_factory.mktemp("weak") / "weak.html"
    path.write_text(page_html(ids, params, hparams["n_head"], text_of, "weak"), encoding="utf-8")
    return path


def test_a_weak_row_still_shades_its_largest_weight_in_full(browser, weak_page):
    open_page(browser, weak_page)
    colours = token_colours(browser)  # the last token is the query: 120 weights of about 0.008
    largest = max(weight for weight, _ in colours)
    assert largest < 0.02
    assert [colour for weight, colour in colours if weight == largest][0] == [9, 105, 218]  # full colour, not white
    assert "No head scores" in browser.find_element("id", "scores-note").text  # the page was made without them


def shown_scores(browser):  # -> [[cell text, ...] per row] of the head scores' table, header first
    return browser.execute_script("return [...document.querySelectorAll('#scores tr')]"
                                  ".map(r => [...r.cells].map(c => c.textContent))")


def test_the_page_shows_the_head_scores_and_a_row_chooses_its_head(reopened, page_path, model_case, repeated):
    opened = reopened
    hparams, params, ids, names, _ = model_case
    scores = head_scores(ids, repeated, params, hparams["n_head"])  # what --heads prints
    scored = heads_json(ids, repeated, scores, range(hparams["n_layer"]))
    assert page_data(page_path)["heads"] == scored  # the page's scores, from its own pass, are --heads's
    rows = shown_scores(opened)
    assert rows[0] == ["layer", "head", "previous", "first", "self", "duplicate", "induction"]
    assert len(rows) - 1 == hparams["n_layer"] * hparams["n_head"] == len(scored["heads"])
    for row, scores in zip(rows[1:], scored["heads"]):
        assert [int(row[0]), int(row[1])] == [scores["layer"], scores["head"]]
        assert [float(cell) for cell in row[2:]] == pytest.approx([scores[p] for p in PATTERNS], abs=0.0005)
    choose(opened, "layer", 0)
    click_token(opened, 25)
    opened.find_element("css selector", '#scores tr[data-layer="2"][data-head="3"]').click()
    assert [opened.find_element("id", picker).get_attribute("value") for picker in ("layer", "head")] == ["2", "3"]
    weights = np.array([float(weight) for _, weight, _ in shown_weights(opened)])
    assert np.abs(weights - names["blocks.2.attn.weights"][3, 25]).max() <= SHOWN_TOLERANCE
    assert opened.find_element("css selector", "#heads .map.chosen").text == "head 3"
    assert "layer 2" in opened.find_element("id", "heads-title").text  # the layer's maps were redrawn
    chosen = opened.find_elements("css selector", "#scores tr.chosen")
    assert [(row.get_attribute("data-layer"), row.get_attribute("data-head")) for row in chosen] == [("2", "3")]


def test_each_map_pixel_shows_the_largest_weight_it_covers(browser, tmp_path):
    # 300 tokens on maps of 150 x 150 pixels: each pixel covers 2 x 2 weights, and must show the largest of them
    hparams = {"n_vocab": 300, "n_ctx": 300, "n_embd": 36, "n_head": 3, "n_layer": 1}
    params = random_params(hparams, 8)
    ids = np.random.default_rng(8).integers(6, 300, 300).tolist()
    path = tmp_path / "maps.html"
    path.write_text(page_html(ids, params, hparams["n_head"], text_of, "maps"), encoding="utf-8")
    open_page(browser, path)
    reds = np.array(browser.execute_script(
        "return [...document.querySelectorAll('#heads .map canvas')].map(canvas => "
        "Array.from(canvas.getContext('2d').getImageData(0, 0, 150, 150).data.filter((_, i) => i % 4 === 0)))"))
    weights = np.rint(trace(ids, params, hparams["n_head"])["blocks.0.attn.weights"] * WEIGHT_SCALE) / WEIGHT_SCALE
    largest = weights.reshape(3, 150, 2, 150, 2).max(axis=(2, 4))  # the largest of each pixel's 2 x 2 weights
    below = np.tril(np.ones((150, 150), bool))  # above the diagonal a pixel is the masked future's grey
    expected = np.floor(255 - 246 * np.sqrt(largest) + 0.5)
    assert np.abs(reds.reshape(3, 150, 150)[:, below] - expected[:, below]).max() <= 1
    last = weights.reshape(3, 150, 2, 150, 2)[:, :, 1, :, 1]  # what the pixel would show were it the last weight
    assert (np.abs(np.floor(255 - 246 * np.sqrt(last) + 0.5) - expected)[:, below] > 10).mean() > 0.2


@pytest.mark.slow
def test_a_screenshot_shows_the_page(opened, tmp_path):
    from PIL import Image  # matplotlib's dependency, in the test extra through it

    path = tmp_path / "page.png"
    assert opened.save_screenshot(str(path))
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape[1] >= 1000
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text, shading, maps: not a blank page


# --- The command line ---


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory.mktemp("html"))




@pytest.mark.slow
def test_the_page_is_titled_by_the_model_it_shows(models_dir, tmp_path):
    hparams = {"n_vocab": 257, "n_ctx": 64, "n_embd": 16, "n_head": 2, "n_layer": 3}
    model = byte_model_dir(tmp_path / "my-model", hparams, random_params(hparams, 3))
    target = tmp_path / "page.html"
    result = run_explain("Hello", "--html", str(target), "--model", str(model), models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert page_data(target)["title"] == "my-model (3 layers of 2 heads, 16 wide) on 5 tokens"
    # a --models-dir whose 124M/ holds another shape: not "GPT-2 124M"
    result = run_explain(PROMPT, "--html", str(target), models_dir=models_dir)
    assert page_data(target)["title"] == "the 124M folder's GPT-2 (2 layers of 4 heads, 64 wide) on 11 tokens"


def test_html_writes_the_page_and_nothing_else(models_dir, tmp_path):
    target = tmp_path / "page.htm"
    result = run_explain(PROMPT, "--html", str(target), models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert f"wrote {target}" in result.stderr
    data = page_data(target)
    assert data["n_layer"] == 2 and data["n_head"] == 4 and len(data["ids"]) == 11
    assert [path.name for path in tmp_path.iterdir()] == ["page.htm"]  # no temporary file left
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())  # an ordinary file, not mkstemp's 600


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


@pytest.mark.slow
@pytest.mark.parametrize("name, fragment", [
    ("no/such/folder/a.html", "--html {tmp}/no/such/folder/a.html: the folder {tmp}/no/such/folder does not exist"),
    ("a.txt", "--html {tmp}/a.txt: the file name must end in .html or .htm (got '.txt')"),
    ("a", "the file name must end in .html or .htm (got no suffix)"),
    ("", "--html {tmp} is a folder: name a .html or .htm file"),
])
def test_bad_html_names_are_one_error_line_with_exit_2(models_dir, tmp_path, name, fragment):
    result = run_explain(PROMPT, "--html", str(tmp_path / name) if name else str(tmp_path), models_dir=models_dir)
    assert_one_error_line(result, fragment.format(tmp=tmp_path))
    assert "loaded" not in result.stderr  # refused before the model loads
    assert list(tmp_path.iterdir()) == []


def test_a_page_through_a_symlink_is_checked_where_it_will_be_written(models_dir, tmp_path):  # after the load, it
    # failed: atomic_write writes through a link, and the check looked at the link's own folder
    (tmp_path / "page.html").symlink_to(tmp_path / "gone" / "page.html")
    result = run_explain(PROMPT, "--html", str(tmp_path / "page.html"), models_dir=models_dir)
    assert_one_error_line(result, f"the folder {tmp_path / 'gone'} does not exist")
    assert "loaded" not in result.stderr


@pytest.mark.parametrize("below", ["a.html", "sub/a.html"])
def test_a_page_below_a_file_names_the_file(models_dir, tmp_path, below):  # not "the folder ... does not exist"
    (tmp_path / "notes").write_text("")
    result = run_explain(PROMPT, "--html", str(tmp_path / "notes" / below), models_dir=models_dir)
    assert_one_error_line(result, f"--html {tmp_path}/notes/{below}: {tmp_path}/notes is a file, not a folder")
