"""Attribution graphs (gpt2_numpy/circuits/) against circuit-tracer's `attribute()`, `prune_graph` and
`create_graph_files` (scripts/fixtures/make_graph_reference.py: the random GPT-2 folders of tests/fixtures/intervene_*,
random transcoders written by our writer into tests/fixtures/transcoders_<case>/ and read by circuit-tracer's
loader), in the library and through `circuits graph`; circuit-tracer's transcoder files read by ours; the YAML subset;
the bad inputs; the transcoders spliced in as MLPs, against model.py's functions composed afresh; SAE latent
attribution against finite differences."""
import json
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy import load_model, model
from gpt2_numpy.sae.transcoder_files import load_transcoders, parse_yaml, save_transcoders
from gpt2_numpy.circuits import graph as graph_module
from gpt2_numpy.circuits.graph import Graph, attribution_graph, select_features
from gpt2_numpy.sae.attribution import latent_attribution
from gpt2_numpy.circuits.prune import prune
from gpt2_numpy.sae.replacement import replacement_edits
from gpt2_numpy.sae.transcoder_model import INPUT_HOOKS, TranscoderSet, encode, transcode
from gpt2_numpy.commands import circuits as circuits_cli
from gpt2_numpy.errors import CheckpointError, Gpt2NumpyError
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.gradients import logit_difference
from gpt2_numpy.params import random_params
from gpt2_numpy.save import save_model
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY
from tests.conftest import FIXTURES, REPO, assert_one_error_line

RTOL = 1e-4  # relative, as the issue asks
FLOOR = 1e-5  # of the largest weight: float32's rounding, for the weights near 0
CASES = {"skip": "three_heads", "jumprelu": "four_heads", "mid": "one_layer"}  # transcoders -> model folder
FIELDS = ("active_features", "selected_features", "activation_values", "logit_token_ids", "logit_probabilities",
          "input_ids")


def reference(case):  # -> circuit-tracer's arrays of the case, {field: array}
    arrays = np.load(FIXTURES / "reference_graph.npz")
    return {key.partition("/")[2]: arrays[key] for key in arrays.files if key.startswith(f"{case}/")}


def case_graph(case):  # -> our Graph of the case's prompt, and circuit-tracer's arrays
    theirs = reference(case)
    hparams, params, _ = load_model(FIXTURES / f"intervene_{CASES[case]}")
    transcoders = load_transcoders(FIXTURES / f"transcoders_{case}")
    return attribution_graph(theirs["input_ids"], params, hparams["n_head"], transcoders), theirs


def assert_close(ours, theirs):  # within RTOL of each of circuit-tracer's numbers, FLOOR of the largest
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=FLOOR * np.abs(theirs).max())


@pytest.mark.parametrize("case", CASES)
def test_the_unpruned_graph_is_circuit_tracer_s(case):
    ours, theirs = case_graph(case)
    assert ours.adjacency.shape == theirs["adjacency"].shape
    assert_close(ours.adjacency, theirs["adjacency"])
    assert (theirs["adjacency"] != 0).sum() > len(theirs["adjacency"])  # a graph with edges, not a trivial one
    for field in FIELDS:
        assert_close(getattr(ours, field), theirs[field])


@pytest.mark.parametrize("case", CASES)
def test_targets_traced_one_at_a_time_give_circuit_tracer_s_graph(case, monkeypatch):
    # a batch of one target is traced up to its own position only (attention is causal): its prefix of the patterns,
    # LayerNorm scales, errors and tokens must be the right one at every position
    monkeypatch.setattr(graph_module, "BATCH_FLOATS", 1)
    ours, theirs = case_graph(case)
    assert_close(ours.adjacency, theirs["adjacency"])


@pytest.mark.parametrize("input_hook", INPUT_HOOKS)
def test_the_skip_connection_s_backward_folds_layer_norm_as_its_formula(input_hook):
    # graph.py folds LayerNorm's frozen gain and centring into W_skip; the fixtures' skips read hook_normalized and
    # hook_resid_mid only: mlp.hook_in's gain is checked here against the unfolded formula
    rng = np.random.default_rng(0)
    d, w_skip = rng.standard_normal((3, 5, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    gain, scale = rng.uniform(0.5, 2, 8).astype(np.float32), rng.uniform(0.5, 2, (5, 1)).astype(np.float32)
    transcoders = TranscoderSet([{"W_skip": w_skip}], input_hook, "hook_mlp_out")
    unfolded = graph_module.input_backward(input_hook, d @ w_skip, gain, scale)
    np.testing.assert_allclose(graph_module.skip_backward(transcoders, 0, d, gain, scale), unfolded, rtol=1e-5,
                               atol=1e-5)


def test_the_most_influential_features_are_circuit_tracer_s():  # its ranking, three rounds of 8, 8 and 4
    theirs = reference("skip")
    hparams, params, _ = load_model(FIXTURES / "intervene_three_heads")
    ours = attribution_graph(theirs["input_ids"], params, hparams["n_head"],
                             load_transcoders(FIXTURES / "transcoders_skip"), max_features=20, queue=8)
    np.testing.assert_array_equal(ours.selected_features, theirs["max_features/selected_features"])
    assert len(ours.selected_features) == 20 and len(ours.active_features) > 20
    assert_close(ours.adjacency, theirs["max_features/adjacency"])


def test_the_ranking_counts_the_paths_through_the_features_traced_so_far():  # by hand, circuit-tracer's rule
    # three features and one other source; the logit reads feature 1 most, then 2, then 0 (shares .05, .5, .25, .2)
    logit_rows = np.array([[0.1, 1.0, 0.5, 0.4]], np.float32)
    feature_rows = np.array([[0, 0, 0, 0], [10, 0, 0, 0], [0, 0, 0, 0]], np.float32)  # feature 1 reads feature 0

    def select(queue):
        return select_features(lambda features: feature_rows[features], logit_rows, np.array([1.0], np.float32), 3,
                               2, queue)
    chosen, rows = select(queue=1)  # feature 1 first; then feature 0's .05 + .5 x 1 through it beats feature 2's .25
    np.testing.assert_array_equal(chosen, [0, 1])
    np.testing.assert_array_equal(rows, feature_rows[[0, 1]])
    np.testing.assert_array_equal(select(queue=2)[0], [1, 2])  # one ranking, by the logit's row alone


@pytest.mark.parametrize("case", CASES)
def test_the_pruned_graph_is_circuit_tracer_s(case):
    ours, theirs = case_graph(case)
    pruned = prune(ours)
    np.testing.assert_array_equal(pruned.node_mask, theirs["node_mask"])
    np.testing.assert_array_equal(pruned.edge_mask, theirs["edge_mask"])
    assert 0 < pruned.node_mask.sum() < len(pruned.node_mask)  # pruning dropped some nodes and kept some
    assert_close(pruned.cumulative_scores, theirs["cumulative_scores"])


def test_pruning_drops_a_feature_with_no_input():  # circuit-tracer's rule, on a graph small enough to do by hand
    # nodes: a feature, an error, a token, a logit; the logit reads the other three equally, the feature reads nothing
    adjacency = np.zeros((4, 4), np.float32)
    adjacency[3, :3] = 1
    graph = Graph(adjacency, np.array([[0, 0, 0]]), np.array([0]), np.array([1.0], np.float32), np.array([0]),
                  np.array([1.0], np.float32), np.array([0]), 1)
    pruned = prune(graph)  # each of the three carries a third of the influence: all kept, and their three edges
    np.testing.assert_array_equal(pruned.node_mask, [False, True, True, True])  # then the feature, with no input
    np.testing.assert_array_equal(pruned.edge_mask.nonzero(), [[3, 3], [1, 2]])  # and its edge go
    np.testing.assert_allclose(pruned.cumulative_scores, [1 / 3, 2 / 3, 1, 1])


def graph_command(tmp_path, case, *more):  # -> the folder `circuits graph` wrote for the case's prompt
    out = tmp_path / "graph"
    with pytest.raises(SystemExit) as exit_info:
        circuits_cli.main(["graph", "--model", str(FIXTURES / f"intervene_{CASES[case]}"), "--transcoders",
                           str(FIXTURES / f"transcoders_{case}"), str(reference(case)["prompt"]), "--out", str(out),
                           *more])
    assert exit_info.value.code == 0
    return out


def test_the_command_writes_circuit_tracer_s_graph_and_viewer_files(tmp_path):
    theirs = reference("jumprelu")
    out = graph_command(tmp_path, "jumprelu")
    written = np.load(out / "graph.npz")
    assert_close(written["adjacency"], theirs["adjacency"])
    for field in (*FIELDS, "node_mask", "edge_mask"):
        assert_close(written[field], theirs[field])
    ours, viewer = json.loads((out / "graph.json").read_text()), json.loads(str(theirs["viewer_json"]))
    assert ours["metadata"] == {**viewer["metadata"], "slug": "graph"}
    assert ours["qParams"] == viewer["qParams"]
    numbers = ("influence", "activation", "token_prob")
    assert [{key: value for key, value in node.items() if key not in numbers} for node in ours["nodes"]] == [
        {key: value for key, value in node.items() if key not in numbers} for node in viewer["nodes"]]
    for key in numbers:
        assert_close(np.array([node[key] or 0 for node in ours["nodes"]], float),
                     np.array([node[key] or 0 for node in viewer["nodes"]], float))
    assert [(link["source"], link["target"]) for link in ours["links"]] == [
        (link["source"], link["target"]) for link in viewer["links"]]
    assert_close(np.array([link["weight"] for link in ours["links"]]),
                 np.array([link["weight"] for link in viewer["links"]]))
    metadata = json.loads((out / "graph-metadata.json").read_text())
    assert metadata == {"graphs": [ours["metadata"]]}


def test_no_bos_gives_the_prompt_s_ids_alone(tmp_path):
    out = graph_command(tmp_path, "mid", "--no-bos", "--max-logits", "3", "--logit-prob", "0.01", "--max-features", "5")
    written = np.load(out / "graph.npz")
    assert len(written["selected_features"]) == 5
    np.testing.assert_array_equal(written["input_ids"], reference("mid")["input_ids"][1:])
    assert len(written["logit_token_ids"]) == 1  # the top logit alone covers 1% of the probability


def test_a_prompt_of_bos_alone_has_no_features_and_still_a_graph():  # position 0's features are all zeroed
    hparams, params, _ = load_model(FIXTURES / "intervene_three_heads")
    graph = attribution_graph([256], params, 3, load_transcoders(FIXTURES / "transcoders_skip"), max_features=4)
    assert graph.active_features.shape == (0, 3) and len(graph.selected_features) == 0
    assert graph.adjacency.shape == (2 + 1 + len(graph.logit_token_ids),) * 2  # 2 errors, 1 token, the logits
    assert graph.adjacency[-1, 2] != 0 and not graph.adjacency[:, :2].any()  # the token reaches them; the errors are 0


def test_circuit_tracer_s_own_files_read_as_ours():
    theirs = load_transcoders(FIXTURES / "transcoders_skip_circuit_tracer")  # TranscoderSet.to_safetensors, yaml.dump
    ours = load_transcoders(FIXTURES / "transcoders_skip")
    assert (theirs.input_hook, theirs.output_hook, theirs.scan) == ("ln2.hook_normalized", "hook_mlp_out",
                                                                    "circuit-tracer-fixture-skip")
    for mine, its in zip(ours.layers, theirs.layers):
        assert mine.keys() == its.keys() == {"W_enc", "W_dec", "b_enc", "b_dec", "W_skip"}
        for name in mine:
            np.testing.assert_array_equal(mine[name], its[name])


def test_files_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    layers = [{"W_enc": rng.normal(size=(6, 4)), "W_dec": rng.normal(size=(6, 4)), "b_enc": rng.normal(size=6),
               "b_dec": rng.normal(size=4), "threshold": rng.uniform(size=6)} for _ in range(2)]
    layers = [{name: array.astype(np.float32) for name, array in layer.items()} for layer in layers]
    save_transcoders(TranscoderSet(layers, "mlp.hook_in", "mlp.hook_out", "it's: a #scan"), tmp_path)
    loaded = load_transcoders(tmp_path)
    assert (loaded.input_hook, loaded.output_hook, loaded.scan) == ("mlp.hook_in", "mlp.hook_out", "it's: a #scan")
    for saved, read in zip(layers, loaded.layers):
        assert saved.keys() == read.keys()
        for name in saved:
            np.testing.assert_array_equal(saved[name], read[name])


def test_the_math_is_relu_jumprelu_and_skip():
    params = {"W_enc": np.array([[1.0, 0], [0, 1], [1, 1]], np.float32), "b_enc": np.array([0, -1, 0], np.float32),
              "W_dec": np.eye(3, 2, dtype=np.float32), "b_dec": np.array([0.5, 0], np.float32),
              "W_skip": np.array([[0, 1], [0, 0]], np.float32)}
    x = np.array([[2.0, 0.5]], np.float32)  # pre-activations 2, -0.5, 2.5
    np.testing.assert_array_equal(encode(params, x), [[2, 0, 2.5]])
    np.testing.assert_array_equal(encode({**params, "threshold": np.array([2, 0, 1], np.float32)}, x), [[0, 0, 2.5]])
    np.testing.assert_array_equal(transcode(params, x), [[2 + 0.5 + 0.5, 0]])  # features, b_dec, x W_skipᵀ


@pytest.mark.parametrize("text", [
    "model_kind: transcoder_set\ntranscoders:\n  - 'a.safetensors'\n  - \"b.safetensors\"\n# a comment\n\n",
    "model_kind: 'transcoder_set'  \ntranscoders:\n- a.safetensors\n- b.safetensors\n",
])
def test_the_yaml_subset_reads_circuit_tracer_s_forms(text):
    assert parse_yaml("config.yaml", text) == {"model_kind": "transcoder_set",
                                               "transcoders": ["a.safetensors", "b.safetensors"]}


@pytest.mark.parametrize("text, message", [
    ("transcoders: [a, b]\n", "line 1"),
    ("scan: &anchor x\n", "line 1"),
    ("a: x\na: y\n", "line 2: key a is given twice"),
    ("- a.safetensors\n", "line 1: a list item"),
    ("a: x\n  b: y\n", "line 2"),
    ("scan: 12\n", "line 1"),
    ("scan: true\n", "line 1"),
    ("scan: x # comment\n", "line 1"),
    ("a: |\n  text\n", "line 1"),
])
def test_the_yaml_subset_refuses_the_rest_naming_the_line(text, message):
    with pytest.raises(CheckpointError, match=message):
        parse_yaml("config.yaml", text)


@pytest.mark.slow  # 300 loads
def test_a_config_yaml_damaged_anywhere_loads_or_is_one_error(tmp_path):  # never a traceback, never a guess
    folder = copy_set(FIXTURES / "transcoders_mid", tmp_path / "set")
    text = (FIXTURES / "transcoders_mid" / "config.yaml").read_bytes()
    rng, outcomes = np.random.default_rng(0), set()
    for _ in range(300):
        damaged = bytearray(text)
        for at in rng.integers(0, len(text), rng.integers(1, 4)):
            damaged[at] = int(rng.choice(list(b" :-'\"#\n\t[{&*|x0\0\xff")))
        (folder / "config.yaml").write_bytes(bytes(damaged))
        try:
            loaded = load_transcoders(folder)
            outcomes.add("loaded")
            assert len(loaded.layers) == 1 and loaded.input_hook in INPUT_HOOKS  # what it read is a whole set
        except Gpt2NumpyError as error:
            outcomes.add("refused")
            assert "\n" not in str(error)
    assert outcomes == {"loaded", "refused"}


def copy_set(source, target):  # -> target: a copy of a transcoder-set folder, to damage
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def damaged_config(tmp_path):
    folder = copy_set(FIXTURES / "transcoders_mid", tmp_path / "set")
    (folder / "config.yaml").write_text("model_kind: transcoder_set\ntranscoders: {layer_0.safetensors}\n")
    return folder


def truncated_layer(tmp_path):
    folder = copy_set(FIXTURES / "transcoders_mid", tmp_path / "set")
    data = (folder / "layer_0.safetensors").read_bytes()
    (folder / "layer_0.safetensors").write_bytes(data[:len(data) // 2])
    return folder


def config_naming(tmp_path, line):
    folder = copy_set(FIXTURES / "transcoders_mid", tmp_path / "set")
    text = (folder / "config.yaml").read_text()
    (folder / "config.yaml").write_text(text.replace("- layer_0.safetensors", line))
    return folder


@pytest.mark.parametrize("transcoders, prompt, message", [
    (lambda tmp: FIXTURES / "transcoders_jumprelu", "hi", "has 3 layers of width 32, but the model has 1 layer of "
     "width 20"),
    (lambda tmp: FIXTURES / "transcoders_mid", "x" * 24, "exceed the model's context of 24"),
    (damaged_config, "hi", "line 2"),
    (truncated_layer, "hi", "layer_0.safetensors"),
    (lambda tmp: config_naming(tmp, "- ../layer_0.safetensors"), "hi", "is not a file name inside the folder"),
    (lambda tmp: tmp / "missing", "hi", "is not a folder"),
])
def test_bad_inputs_get_one_error_line_and_write_nothing(tmp_path, capsys, transcoders, prompt, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        circuits_cli.main(["graph", "--model", str(FIXTURES / "intervene_one_layer"), "--transcoders",
                           str(transcoders(tmp_path)), prompt, "--out", str(out)])
    output = capsys.readouterr()
    assert_one_error_line(subprocess.CompletedProcess([], exit_info.value.code, output.out, output.err), message)
    assert not out.exists()


def test_a_model_without_the_bos_in_its_vocabulary_is_refused_before_it_runs(tmp_path, capsys):
    hparams = {"n_vocab": 300, "n_ctx": 16, "n_embd": 20, "n_head": 2, "n_layer": 1}  # GPT-2's tokenizer, 300 ids
    save_model(tmp_path / "model", hparams, random_params(hparams, 0), PACKAGED_VOCABULARY)
    argv = ["graph", "--model", str(tmp_path / "model"), "--transcoders", str(FIXTURES / "transcoders_mid"), "!",
            "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        circuits_cli.main(argv)
    output = capsys.readouterr()
    assert_one_error_line(subprocess.CompletedProcess([], exit_info.value.code, output.out, output.err),
                          "the BOS's token 50256 ('<|endoftext|>', position 0) is outside this model's vocabulary")
    with pytest.raises(SystemExit) as exit_info:
        circuits_cli.main([*argv, "--no-bos"])  # "!" is token 0
    assert exit_info.value.code == 0 and np.load(tmp_path / "out" / "graph.npz")["input_ids"].tolist() == [0]


def test_an_out_folder_of_other_files_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        circuits_cli.main(["graph", "--model", str(FIXTURES / "intervene_one_layer"), "--transcoders",
                           str(FIXTURES / "transcoders_mid"), "hi", "--out", str(tmp_path)])
    output = capsys.readouterr()
    assert_one_error_line(subprocess.CompletedProcess([], exit_info.value.code, output.out, output.err),
                          "holds other files (notes.txt)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.slow  # a Python of its own
def test_the_command_imports_no_torch(tmp_path):
    code = ("import sys; from gpt2_numpy.commands import circuits; "
            "exec('try: circuits.main(sys.argv[1:])\\nexcept SystemExit: pass'); "
            "print(sorted(name for name in ('torch', 'circuit_tracer', 'transformer_lens', 'yaml') "
            "if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code, "graph", "--model", str(FIXTURES / "intervene_one_layer"),
                             "--transcoders", str(FIXTURES / "transcoders_mid"), "hello", "--out",
                             str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]" and (tmp_path / "out" / "graph.npz").exists()


def by_hand(ids, params, n_head, transcoders, mlp_out):  # -> logits of GPT-2 whose MLP outputs mlp_out gives
    """model.py's functions composed afresh: mlp_out(layer, x_mid, own) -> the MLP's output, own the MLP's own."""
    x = params["wte"][ids] + params["wpe"][:len(ids)]
    for layer, block in enumerate(params["blocks"]):
        x = x + model.mha(model.layer_norm(x, **block["ln_1"]), **block["attn"], n_head=n_head)
        x = x + mlp_out(layer, x, model.ffn(model.layer_norm(x, **block["ln_2"]), **block["mlp"]))
    return model.layer_norm(x, **params["ln_f"]) @ params["wte"].T


def hook_input(transcoders, layer, mid, ln_2):  # -> what the layer's transcoder reads, from the stream after attention
    return {"ln2.hook_normalized": model.layer_norm(mid, 1, 0), "mlp.hook_in": model.layer_norm(mid, **ln_2),
            "hook_resid_mid": mid}[transcoders.input_hook]


@pytest.mark.parametrize("case", CASES)
def test_the_splice_replaces_each_mlp_by_its_transcoder(case):
    hparams, params, _ = load_model(FIXTURES / f"intervene_{CASES[case]}")
    transcoders, ids = load_transcoders(FIXTURES / f"transcoders_{case}"), reference(case)["input_ids"]
    ours = run_with_edits(ids, params, hparams["n_head"], replacement_edits(transcoders), names=["logits"])["logits"]
    expected = by_hand(ids, params, hparams["n_head"], transcoders, lambda layer, mid, own: transcode(
        transcoders.layers[layer], hook_input(transcoders, layer, mid, params["blocks"][layer]["ln_2"])))
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
    assert np.abs(ours - model.gpt2(ids, **params, n_head=hparams["n_head"])).max() > 1e-2  # the MLPs did change


def test_the_splice_with_its_error_is_the_model_until_a_feature_is_zeroed():
    hparams, params, _ = load_model(FIXTURES / "intervene_three_heads")
    transcoders, ids, n_head = load_transcoders(FIXTURES / "transcoders_skip"), reference("skip")["input_ids"], 3
    kept = run_with_edits(ids, params, n_head, replacement_edits(transcoders, keep_error=True), names=["logits"])
    np.testing.assert_allclose(kept["logits"], model.gpt2(ids, **params, n_head=n_head), rtol=1e-4, atol=1e-4)
    layer, position, feature = reference("skip")["active_features"][-1]  # a feature that fired
    zeroed = run_with_edits(ids, params, n_head, replacement_edits(transcoders, keep_error=True, zeroed=[
        (layer, position, feature)]), names=["logits"])["logits"]

    def without_feature(at, mid, own):  # the MLP's own output less the feature's write, at its position alone
        if at != layer:
            return own
        params_at = transcoders.layers[at]
        write = encode(params_at, hook_input(transcoders, at, mid, params["blocks"][at]["ln_2"]))[position, feature]
        return own - np.eye(len(ids))[position][:, None] * write * params_at["W_dec"][feature]
    np.testing.assert_allclose(zeroed, by_hand(ids, params, n_head, transcoders, without_feature), rtol=1e-4,
                               atol=1e-4)
    assert np.abs(zeroed - kept["logits"]).max() > 1e-3


class TinySAE:  # an SAE as latent_attribution reads one: ReLU latents, a decoder; written here, not imported
    def __init__(self, d_in, d_sae, hook, seed=0):
        rng = np.random.default_rng(seed)
        self.hook, self.params = hook, {"W_enc": rng.normal(0, 1 / np.sqrt(d_in), (d_in, d_sae)),
                                        "b_enc": rng.normal(-0.2, 0.1, d_sae),
                                        "W_dec": rng.normal(0, 1 / np.sqrt(d_sae), (d_sae, d_in))}

    def encode(self, x):
        return np.maximum(x @ self.params["W_enc"] + self.params["b_enc"], 0)

    def decode(self, f):
        return f @ self.params["W_dec"]

    def reconstruct(self, x):
        return self.decode(self.encode(x))


@pytest.mark.parametrize("spliced", [True, False])
def test_latent_attribution_is_the_metric_s_derivative_in_each_latent_s_scale(spliced):
    hparams, params, _ = load_model(FIXTURES / "intervene_three_heads")
    params = float64(params)  # finite differences need the precision
    ids, n_head, hook = reference("skip")["input_ids"], 3, "blocks.0.out"
    sae, metric = TinySAE(24, 16, hook), logit_difference(65, 66)
    scores = latent_attribution(ids, params, n_head, sae, metric, spliced)
    x = run_with_edits(ids, params, n_head, [], names=[hook])[hook]
    f, step = sae.encode(x), 1e-4
    base = x - sae.reconstruct(x) if not spliced else 0  # the error, added back when not spliced

    def metric_with(position, latent, scale):  # the metric with one latent's activation scaled
        g = f.copy()
        g[position, latent] *= scale
        run = run_with_edits(ids, params, n_head, [Edit(hook, lambda _: sae.decode(g) + base)])
        return metric(run)[0]
    active = np.argwhere(f > 0)[::7]
    assert len(active) > 5
    for position, latent in active:  # d metric / d log-scale of the latent = its activation x its gradient
        slope = (metric_with(position, latent, 1 + step) - metric_with(position, latent, 1 - step)) / (2 * step)
        assert scores[position, latent] == pytest.approx(slope, rel=1e-5, abs=1e-9)
    assert (scores[f == 0] == 0).all() and np.abs(scores).max() > 1e-3


def float64(tree):  # -> the params with every array in float64
    return {key: float64(value) for key, value in tree.items()} if isinstance(tree, dict) else (
        [float64(each) for each in tree] if isinstance(tree, list) else np.asarray(tree, np.float64))
