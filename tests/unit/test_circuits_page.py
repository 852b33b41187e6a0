"""graph.html, the page `circuits graph` writes beside graph.npz, opened in headless Chromium (the attention page's
browser, network cut off), from real runs on a byte-level model and random transcoders of its own: every kept node
and edge drawn, rows by layer and columns by position; a click on a node shows its fields and its strongest edges with
graph.npz's numbers (read from graph.npz, not from the page's JSON); a feature's contexts against its activations
computed here from model.py's functions; without --contexts-from, how to get them; a prompt of </script><script> and
<img onerror> shown as text, running nothing, with nothing fetched."""
import json
import subprocess

import numpy as np
import pytest

from gpt2_numpy import model
from gpt2_numpy.sae.transcoder_files import save_transcoders
from gpt2_numpy.sae.transcoder_model import TranscoderSet
from gpt2_numpy.commands import circuits as circuits_cli
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES, assert_one_error_line, byte_model_dir
from tests.unit.test_page import browser  # noqa: F401  (the fixture: headless Chromium, offline)

HPARAMS = {"n_vocab": 257, "n_ctx": 96, "n_embd": 16, "n_head": 2, "n_layer": 2}
PROMPT = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
TEXT = "the cat sat on the mat, and the dog sat on the log. " * 6
WINDOWS = 3  # of 96 tokens: the text's first 288 bytes
TOP_EDGES = 8  # the panel's edges each way
CONTEXTS = 5


def byte_ids(text):  # the byte model's ids: the bytes in GPT-2's byte order (conftest.byte_model_dir)
    from gpt2_numpy.tokenizer import bytes_to_unicode

    order = {byte: token_id for token_id, byte in enumerate(bytes_to_unicode())}
    return [order[byte] for byte in text.encode()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # -> (params, transcoders, graph.npz's arrays, the page with contexts, the page without)
    root = tmp_path_factory.mktemp("graph-page")
    params = random_params(HPARAMS, 3)
    byte_model_dir(root / "model", HPARAMS, params)
    rng = np.random.default_rng(4)
    layers = [{"W_enc": rng.normal(0, 0.5, (24, 16)).astype(np.float32),
               "b_enc": np.full(24, -0.8, np.float32),
               "W_dec": rng.normal(0, 0.3, (24, 16)).astype(np.float32),
               "b_dec": np.zeros(16, np.float32)} for _ in range(2)]
    transcoders = TranscoderSet(layers, "ln2.hook_normalized", "hook_mlp_out")
    save_transcoders(transcoders, root / "transcoders")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    common = ["graph", "--model", str(root / "model"), "--transcoders", str(root / "transcoders"), "--max-features",
              "60"]
    for out, more in (("with", ["--contexts-from", str(root / "text.txt"), "--windows", str(WINDOWS)]),
                      ("without", [])):
        with pytest.raises(SystemExit) as exit_info:
            circuits_cli.main([*common, PROMPT if out == "with" else "the cat", "--out", str(root / out), *more])
        assert exit_info.value.code == 0
    return params, transcoders, np.load(root / "with" / "graph.npz"), root / "with" / "graph.html", \
        root / "without" / "graph.html"


def open_page(browser, path):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")  # drop what earlier pages logged
    browser.get_log("performance")
    browser.get(path.as_uri())
    WebDriverWait(browser, 30).until(lambda driver: driver.execute_script("return document.body.dataset.ready"))


@pytest.fixture(scope="module")
def opened(browser, run):  # noqa: F811
    open_page(browser, run[3])
    return browser


def kept_edges(graph):  # -> bool [n, n]: the kept edges between kept nodes, from graph.npz
    nodes = graph["node_mask"]
    return graph["edge_mask"] & nodes[:, None] & nodes[None, :]


def strongest(weights, mask):  # -> [(node, weight)] of the TOP_EDGES largest |weight| where mask holds
    found = np.flatnonzero(mask)
    order = found[np.argsort(-np.abs(weights[found]), kind="stable")][:TOP_EDGES]
    return [(int(node), float(weights[node])) for node in order]


def click(browser, index):  # noqa: F811
    browser.find_element("css selector", f'.node[data-index="{index}"] :is(circle, rect)').click()


def panel(browser):  # noqa: F811  -> the panel's shown fields and edge rows
    return browser.execute_script("""
        const rows = kind => [...document.querySelectorAll(`#details table.${kind} tr`)].map(
            row => [+row.dataset.node, row.querySelector('.weight').textContent]);
        return {index: +document.getElementById('details').dataset.index,
                title: document.querySelector('#details h2').textContent,
                fields: Object.fromEntries([...document.querySelectorAll('#details dd')].map(
                    d => [d.dataset.field, d.textContent])),
                incoming: rows('incoming'), outgoing: rows('outgoing')};""")


@pytest.mark.slow  # a graph, and a browser
def test_the_page_draws_every_kept_node_and_edge_by_layer_and_position(opened, run):
    graph = run[2]
    n_features, n_seq = len(graph["selected_features"]), len(graph["input_ids"])
    drawn = opened.execute_script("""
        return [...document.querySelectorAll('.node')].map(g => {
            const box = g.querySelector('circle, rect').getBoundingClientRect();
            return [+g.dataset.index, g.getAttribute('class').split(' ')[1], box.x + box.width / 2,
                    box.y + box.height / 2];});""")
    assert [index for index, _, _, _ in drawn] == np.flatnonzero(graph["node_mask"]).tolist()
    edges = opened.execute_script(
        "return [...document.querySelectorAll('.edge')].map(e => [+e.dataset.target, +e.dataset.source])")
    assert sorted(map(tuple, edges)) == sorted(zip(*map(np.ndarray.tolist, kept_edges(graph).nonzero())))
    assert len(edges) > 20
    rows = {}  # y of each kind of row, from graph.npz's node order
    for index, kind, x, y in drawn:
        if index < n_features:
            layer, position, _ = graph["active_features"][graph["selected_features"][index]]
            assert kind == "feature"
            rows.setdefault(f"layer {layer}", set()).add(round(y))
        elif index < n_features + 2 * n_seq:
            assert kind == "error"
            rows.setdefault(f"layer {(index - n_features) // n_seq}", set()).add(round(y))
        elif index < n_features + 3 * n_seq:
            assert kind == "token"
            rows.setdefault("tokens", set()).add(round(y))
        else:
            assert kind == "logit"
            rows.setdefault("logits", set()).add(round(y))
    assert all(len(ys) == 1 for ys in rows.values())  # one row each
    heights = [rows[name].pop() for name in ("tokens", "layer 0", "layer 1", "logits")]
    assert heights[0] > heights[1] > heights[2] > heights[3]  # tokens at the bottom, the logits at the top
    tokens_x = [x for index, kind, x, _ in drawn if kind == "token"]
    assert len(tokens_x) == n_seq and np.all(np.diff(tokens_x) > 0)  # columns by position


@pytest.mark.slow
def test_a_click_on_a_feature_shows_its_fields_and_strongest_edges_from_graph_npz(opened, run):
    graph = run[2]
    edges, adjacency = kept_edges(graph), graph["adjacency"]
    n_features = len(graph["selected_features"])
    # the kept feature with the most kept edges, in and out
    feature = max(np.flatnonzero(graph["node_mask"][:n_features]), key=lambda i: edges[i].sum() + edges[:, i].sum())
    assert edges[feature].sum() >= 2 and edges[:, feature].sum() >= 2
    click(opened, feature)
    shown = panel(opened)
    layer, position, index = graph["active_features"][graph["selected_features"][feature]]
    assert shown["index"] == feature
    assert shown["title"] == f"feature {index} · layer {layer} · position {position}"
    assert (shown["fields"]["layer"], shown["fields"]["position"], shown["fields"]["index"]) == (
        str(layer), str(position), str(index))
    activation = graph["activation_values"][graph["selected_features"][feature]]
    assert float(shown["fields"]["activation"]) == pytest.approx(activation, rel=5e-4)
    for kind, weights, mask in (("incoming", adjacency[feature], edges[feature]),
                                ("outgoing", adjacency[:, feature], edges[:, feature])):
        expected = strongest(weights, mask)
        assert [node for node, _ in shown[kind]] == [node for node, _ in expected]
        np.testing.assert_allclose([float(text) for _, text in shown[kind]], [w for _, w in expected], rtol=5e-4)
    # a row of its table takes the panel to the node at the edge's other end
    source = shown["incoming"][0][0]
    opened.find_element("css selector", f'#details table.incoming tr[data-node="{source}"]').click()
    assert panel(opened)["index"] == source


@pytest.mark.slow
def test_a_logit_shows_its_probability_and_its_strongest_inputs(opened, run):
    graph = run[2]
    n = len(graph["adjacency"])
    top = n - len(graph["logit_token_ids"])  # the likeliest logit, the first logit node
    click(opened, top)
    shown = panel(opened)
    assert float(shown["fields"]["probability"]) == pytest.approx(graph["logit_probabilities"][0], rel=5e-4)
    expected = strongest(graph["adjacency"][top], kept_edges(graph)[top])
    assert [node for node, _ in shown["incoming"]] == [node for node, _ in expected]
    assert shown["outgoing"] == []
    from gpt2_numpy.tokenizer import bytes_to_unicode

    byte_of = list(bytes_to_unicode())  # token id -> its byte, as byte_ids orders them
    printable = [(rank, byte_of[token]) for rank, token in enumerate(graph["logit_token_ids"].tolist())
                 if 33 <= byte_of[token] < 127 and chr(byte_of[token]) not in "\\\""]
    assert len({byte for _, byte in printable}) >= 2  # logits of two different letters: their titles must differ
    for rank, byte in printable:
        click(opened, top + rank)
        assert panel(opened)["title"] == f'logit "{chr(byte)}"'


def feature_activations(params, transcoders, ids, layer, feature):  # -> [n_seq]: by model.py's functions, here
    x = params["wte"][ids] + params["wpe"][:len(ids)]
    for block in params["blocks"][:layer]:
        x = x + model.mha(model.layer_norm(x, **block["ln_1"]), **block["attn"], n_head=HPARAMS["n_head"])
        x = x + model.ffn(model.layer_norm(x, **block["ln_2"]), **block["mlp"])
    block = params["blocks"][layer]
    mid = x + model.mha(model.layer_norm(x, **block["ln_1"]), **block["attn"], n_head=HPARAMS["n_head"])
    weights = transcoders.layers[layer]
    values = np.maximum(model.layer_norm(mid, 1, 0) @ weights["W_enc"][feature] + weights["b_enc"][feature], 0)
    values[0] = 0  # position 0's features are zeroed, in the graph as in its contexts
    return values


@pytest.mark.slow
def test_a_feature_shows_its_strongest_contexts_in_the_text(opened, run):
    params, transcoders, graph = run[:3]
    windows = np.array(byte_ids(TEXT)[:WINDOWS * 96]).reshape(WINDOWS, 96)
    n_features = len(graph["selected_features"])
    for node in np.flatnonzero(graph["node_mask"][:n_features])[:3]:
        layer, _, feature = graph["active_features"][graph["selected_features"][node]]
        values = np.stack([feature_activations(params, transcoders, w, layer, feature) for w in windows])
        order = np.argsort(-values.ravel(), kind="stable")[:CONTEXTS]
        order = order[values.ravel()[order] > 0]
        click(opened, node)
        contexts = opened.execute_script("""
            return [...document.querySelectorAll('#details .context')].map(row => [
                +row.querySelector('.value').textContent,
                row.querySelector('.token.peak').textContent,
                [...row.querySelectorAll('.token')].map(t => +t.dataset.act)]);""")
        assert len(contexts) == len(order)
        for (value, peak, acts), flat in zip(contexts, order):
            window, position = divmod(int(flat), 96)
            assert value == pytest.approx(values[window, position], rel=1e-3)
            assert peak == TEXT[window * 96 + position]
            start = max(0, position - 12)  # sae features' span: 12 tokens before the peak, 4 after
            np.testing.assert_allclose(acts, values[window, start:position + 5], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_hostile_prompt_runs_nothing_and_nothing_is_fetched(opened, run):
    html = run[3].read_text(encoding="utf-8")
    assert html.count("<script") == 1 and html.count("</script>") == 1  # the prompt's came in escaped
    assert opened.execute_script("return window.pwned") is None
    assert opened.execute_script("return document.querySelectorAll('img, iframe, object, embed').length") == 0
    assert opened.execute_script("return document.scripts.length") == 1
    assert opened.execute_script("return document.getElementById('prompt').textContent") == "<|endoftext|>" + PROMPT
    assert opened.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert [entry for entry in opened.get_log("browser") if entry["level"] == "SEVERE"] == []
    events = [json.loads(entry["message"])["message"] for entry in opened.get_log("performance")]
    assert [e for e in events if e["method"] == "Network.requestWillBeSent"
            and not e["params"]["request"]["url"].startswith("file:")] == []


@pytest.mark.slow
def test_without_contexts_from_a_feature_says_how_to_get_them(browser, run):  # noqa: F811
    # last: it moves the browser off the page the tests above share
    open_page(browser, run[4])
    feature = browser.execute_script("return document.querySelector('.node.feature').dataset.index")
    click(browser, feature)
    note = browser.execute_script("return document.querySelector('#details .no-contexts').textContent")
    assert note.startswith("No contexts: run circuits graph again with --contexts-from FILE")
    assert browser.execute_script("return document.querySelectorAll('#details .context').length") == 0


@pytest.mark.parametrize("more, fragment", [
    (["--windows", "3"], "--windows belongs to --contexts-from: add --contexts-from FILE, or drop --windows"),
    (["--contexts-from", "{tmp}/missing.txt"], "cannot read --contexts-from {tmp}/missing.txt"),
    (["--contexts-from", "{tmp}/empty.txt"], "--contexts-from {tmp}/empty.txt is empty"),
    (["--contexts-from", "{tmp}/bad.txt"], "--contexts-from {tmp}/bad.txt is not UTF-8 text"),
])
def test_bad_contexts_options_get_one_error_line_and_write_nothing(tmp_path, capsys, more, fragment):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.txt").write_bytes(b"the \xff cat")
    with pytest.raises(SystemExit) as exit_info:
        circuits_cli.main(["graph", "--model", str(FIXTURES / "intervene_one_layer"), "--transcoders",
                           str(FIXTURES / "transcoders_mid"), "hi", "--out", str(tmp_path / "out"),
                           *(word.format(tmp=tmp_path) for word in more)])
    output = capsys.readouterr()
    assert_one_error_line(subprocess.CompletedProcess([], exit_info.value.code, output.out, output.err),
                          fragment.format(tmp=tmp_path))
    assert not (tmp_path / "out").exists()


def test_a_second_run_may_write_over_the_first_run_s_folder_page_and_all(tmp_path):
    argv = ["graph", "--model", str(FIXTURES / "intervene_one_layer"), "--transcoders",
            str(FIXTURES / "transcoders_mid"), "hi", "--out", str(tmp_path)]
    for _ in range(2):  # the second finds graph.html among the files, its own
        with pytest.raises(SystemExit) as exit_info:
            circuits_cli.main(argv)
        assert exit_info.value.code == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(circuits_cli.WRITTEN)
