"""load_params on checkpoints written by TensorFlow and by Hugging Face, and every kind of damage to them.

Expected weights are random_params of the "tiny" config (what both fixture scripts saved); expected logits are
Hugging Face's (scripts/fixtures/make_reference.py).
"""
import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from gpt2_numpy.formats.checkpoint import load_params, verify_checkpoint
from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats.tf_bundle import table_records
from gpt2_numpy.model import gpt2
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES, HF_TOLERANCE
from scripts.common.fuzzing.tf_index import VARINT, fields_of, fields_of_value, proto, set_field, table

TINY = json.loads((FIXTURES / "configs.json").read_text())["tiny"]
DATA, INDEX, SAFETENSORS = "model.ckpt.data-00000-of-00001", "model.ckpt.index", "model.safetensors"
FIXTURE_DIRS = ["tf_tiny", "hf_tiny", "hf_tiny_hub"]  # TF's SaveV2; save_pretrained; hub style (no prefix, buffers)


def copy_fixture(tmp_path, name):  # -> a scratch copy of tests/fixtures/<name>
    return shutil.copytree(FIXTURES / name, tmp_path / name)


def assert_same_params(actual, expected):  # same nested keys, float32 arrays equal to the last bit
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if key == "blocks":
            assert len(actual[key]) == len(value)
            for actual_block, block in zip(actual[key], value):
                assert_same_params(actual_block, block)
        elif isinstance(value, dict):
            assert_same_params(actual[key], value)
        else:
            assert actual[key].dtype == np.float32
            np.testing.assert_array_equal(actual[key], value)


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_fixture_holds_exactly_the_seeded_weights(name):
    hparams, params = load_params(FIXTURES / name, verify=True)
    assert hparams == TINY["hparams"]
    assert_same_params(params, random_params(TINY["hparams"], TINY["seed"]))


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_loaded_fixture_gives_hugging_faces_logits(name):
    reference = np.load(FIXTURES / "reference_tiny.npz")
    hparams, params = load_params(FIXTURES / name)
    logits = gpt2(reference["inputs"], **params, n_head=hparams["n_head"])
    assert np.abs(logits - reference["logits"]).max() <= HF_TOLERANCE
    np.testing.assert_array_equal(logits.argmax(-1), reference["logits"].argmax(-1))


def test_tf_weights_are_views_of_the_mapped_file_not_copies():
    _, params = load_params(FIXTURES / "tf_tiny")
    wte = params["wte"]
    assert not wte.flags.owndata and not wte.flags.writeable  # a read-only view: the file is never written


def test_checkpoint_file_names_the_prefix(tmp_path):
    folder = copy_fixture(tmp_path, "tf_tiny")
    for path in folder.glob("model.ckpt.*"):
        path.rename(folder / path.name.replace("model.ckpt", "step-1000"))
    (folder / "checkpoint").write_text('model_checkpoint_path: "step-1000"\nall_model_checkpoint_paths: "step-1000"\n')
    assert_same_params(load_params(folder)[1], random_params(TINY["hparams"], TINY["seed"]))


def read_safetensors_raw(path):  # -> (header dict, data bytes)
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def write_safetensors_raw(path, header, data):
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


def write_float16_safetensors(path, arrays):  # {name: float32 array} -> a safetensors file of them as F16
    header, offset = {}, 0
    for name, array in arrays.items():
        header[name] = {"dtype": "F16", "shape": list(array.shape), "data_offsets": [offset, offset + array.size * 2]}
        offset += array.size * 2
    write_safetensors_raw(path, header, b"".join(array.astype("<f2").tobytes() for array in arrays.values()))


def half_rounded(params):  # params with every array rounded to float16 and back
    return {key: [half_rounded(block) for block in value] if key == "blocks" else
            half_rounded(value) if isinstance(value, dict) else value.astype(np.float16).astype(np.float32)
            for key, value in params.items()}


def test_float16_safetensors_load_as_float32(tmp_path):
    folder = copy_fixture(tmp_path, "hf_tiny")
    header, data = read_safetensors_raw(folder / SAFETENSORS)
    header.pop("__metadata__")
    write_float16_safetensors(folder / SAFETENSORS, {
        name: np.frombuffer(data, "<f4", np.prod(entry["shape"]), entry["data_offsets"][0]).reshape(entry["shape"])
        for name, entry in header.items()})
    assert_same_params(load_params(folder)[1], half_rounded(random_params(TINY["hparams"], TINY["seed"])))


def test_corrupt_data_loads_unverified_but_fails_verification(tmp_path):
    folder = copy_fixture(tmp_path, "tf_tiny")
    flip_byte(folder / DATA, 5000)  # inside model/wte, the first tensor TensorFlow wrote
    assert not np.array_equal(load_params(folder)[1]["wte"], random_params(TINY["hparams"], TINY["seed"])["wte"])
    with pytest.raises(CheckpointError, match=f"{DATA}: tensor model/wte fails its CRC32C check"):
        verify_checkpoint(folder)


def test_official_folder_without_its_data_file_names_it(official_124m):
    with pytest.raises(CheckpointError, match=f"{DATA} is missing; download"):
        load_params(official_124m)


# --- Damage: each case mutates a scratch copy of a fixture and must raise CheckpointError saying what is wrong ---


def edit_safetensors_header(path, edit):  # edit(header dict) changes it in place; the data bytes stay
    header, data = read_safetensors_raw(path)
    edit(header)
    write_safetensors_raw(path, header, data)


def edit_entry(path, name, **changes):  # changes one tensor's dtype / shape / data_offsets in the header
    edit_safetensors_header(path, lambda header: header[name].update(changes))


def edit_json(path, **changes):  # sets keys of a JSON file; a value of None deletes the key
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps({key: value for key, value in config.items() if value is not None}))


def flip_byte(path, position):
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path, size):  # keeps the first size bytes (a negative size cuts that many from the end)
    path.write_bytes(path.read_bytes()[:size])


def replace_with_directory(path):  # unreadable even for root, which a chmod is not
    path.unlink()
    path.mkdir()


def on(name, damage, *args, **kwargs):  # -> a damage to the file called name in the folder it is given
    return lambda folder: damage(folder / name, *args, **kwargs)


def append(path, data):
    path.write_bytes(path.read_bytes() + data)


def rename_entry(path, old, new):
    edit_safetensors_header(path, lambda header: header.update({new: header.pop(old)}))


def drop_field(path, name, field):
    edit_safetensors_header(path, lambda header: header[name].pop(field))


def write_header_text(path, text):  # the header becomes this JSON text; the data bytes stay
    _, data = read_safetensors_raw(path)
    path.write_bytes(len(text.encode()).to_bytes(8, "little") + text.encode() + data)


def raw_field(path, name, field, text):  # one field's value becomes this JSON text, e.g. a number no int holds
    header, _ = read_safetensors_raw(path)
    header[name][field] = "RAW"
    write_header_text(path, json.dumps(header).replace('"RAW"', text))


def repeat_tensor(path, name):  # the header names the tensor twice (Python's json would keep the second silently)
    header, _ = read_safetensors_raw(path)
    write_header_text(path, json.dumps(header)[:-1] + f", {json.dumps(name)}: {json.dumps(header[name])}}}")


def edit_index(path, edit):  # edit([(key, value)]) -> records; the index is rewritten with valid block CRCs
    path.write_bytes(table(edit(list(table_records(path.read_bytes())))))


def with_field(record, number, value):  # -> an edit setting a varint field of one record's message (0: the header)
    def edit(records):
        key, message = records[record]
        records[record] = (key, proto(set_field(fields_of(message), number, VARINT, value)))
        return records
    return edit


def into_first_tensor(records):  # the second tensor's entry takes the first's offset: both name the same bytes
    return with_field(2, 4, fields_of_value(records[1][1]).get(4, 0))(records)


def swap_first_tensors(records):
    return [records[0], records[2], records[1], *records[3:]]


def repeat_first_tensor(records):
    return [records[0], records[1], *records[1:]]


W = "transformer.h.0.attn.c_attn.weight"  # data_offsets [768, 49920], right after c_attn.bias at [0, 768]
TF_DAMAGE = {  # id: (damage to a copy of tf_tiny, fragments the message must contain)
    "data truncated": (on(DATA, truncate, -100), [DATA, "tensor model/ln_f/b needs bytes", "(truncated"]),
    "data empty": (on(DATA, truncate, 0), [DATA, "tensor model/h0/attn/c_attn/b", "file ends at byte 0"]),
    "data byte flipped": (on(DATA, flip_byte, -1), [DATA, "tensor model/ln_f/b fails its CRC32C check"]),
    "data shard missing": (on(DATA, Path.unlink), [f"{DATA} is missing"]),
    "data unreadable": (on(DATA, replace_with_directory), [f"{DATA} cannot be read"]),
    "index byte flipped": (on(INDEX, flip_byte, 20), [INDEX, "block at byte 0 fails its CRC32C check"]),
    "index trailer flipped": (on(INDEX, flip_byte, -49), [INDEX, "block at byte 916 fails its CRC32C check"]),
    "index truncated": (on(INDEX, truncate, 500), [INDEX, "footer magic number is wrong"]),
    "index empty": (on(INDEX, truncate, 0), [INDEX, "0 bytes is too short"]),
    "footer magic wrong": (on(INDEX, flip_byte, -1), [INDEX, "footer magic number is wrong"]),
    "index missing": (on(INDEX, Path.unlink), [f"{INDEX} is missing"]),
    "checkpoint names nothing": (on("checkpoint", Path.write_text, "\n"), ["names no model_checkpoint_path"]),
    "checkpoint names another prefix": (on("checkpoint", Path.write_text, 'model_checkpoint_path: "x"'),
                                        ["x.index is missing (", "checkpoint names the checkpoint x)"]),
    "prefix holds a line break": (on("checkpoint", Path.write_text, 'model_checkpoint_path: "model\n.ckpt"'),
                                  ["checkpoint names the checkpoint 'model\\n.ckpt', which holds unprintable"]),
    "entry points into another tensor": (on(INDEX, edit_index, into_first_tensor),
                                         [INDEX, "tensors model/h0/attn/c_attn/b and model/h0/attn/c_attn/w overlap"]),
    "2**31 data shards": (on(INDEX, edit_index, with_field(0, 1, 2**31)),
                          ["data-00000-of-2147483648 is missing (", "index lists 2,147,483,648 data shards)"]),
    "index keys out of order": (on(INDEX, edit_index, swap_first_tensors),
                                [INDEX, "keys are not in increasing order (at model/h0/attn/c_attn/b)"]),
    "index key repeated": (on(INDEX, edit_index, repeat_first_tensor),
                           [INDEX, "keys are not in increasing order (at model/h0/attn/c_attn/b)"]),
    "n_embd disagrees": (on("hparams.json", edit_json, n_embd=32),
                         ["disagree: tensor model/h0/attn/c_attn/b has shape [192] but", "imply [96]"]),
    "n_vocab disagrees": (on("hparams.json", edit_json, n_vocab=500),
                          ["tensor model/wte has shape [512, 64] but", "imply [500, 64]"]),
    "n_layer too small": (on("hparams.json", edit_json, n_layer=1), ["tensor model/h1/attn/c_attn/b has no place"]),
    "n_layer too large": (on("hparams.json", edit_json, n_layer=3), ["the weights lack blocks/2/"]),
    "n_head does not divide n_embd": (on("hparams.json", edit_json, n_head=5), ["n_embd divisible by n_head"]),
    "hparams key missing": (on("hparams.json", edit_json, n_ctx=None), ["lacks the hyperparameter 'n_ctx'"]),
    "hparams not JSON": (on("hparams.json", Path.write_text, "{"), ["hparams.json is not valid JSON"]),
    "hparams missing": (on("hparams.json", Path.unlink), ["hparams.json is missing"]),
    "hparams unreadable": (on("hparams.json", replace_with_directory), ["hparams.json cannot be read"]),
}
HF_DAMAGE = {  # id: (damage to a copy of hf_tiny, fragments the message must contain)
    "header past end of file": (on(SAFETENSORS, truncate, 1000), [SAFETENSORS, "runs past the end"]),
    "header size over the cap": (on(SAFETENSORS, Path.write_bytes, (2**40).to_bytes(8, "little") + bytes(9)),
                                 ["declares 1,099,511,627,776 bytes, over the 104,857,600-byte limit"]),
    "shorter than a header size": (on(SAFETENSORS, truncate, 5), [SAFETENSORS, "5 bytes, too few"]),
    "header not JSON": (on(SAFETENSORS, flip_byte, 8), [SAFETENSORS, "header is not valid JSON"]),
    "header not an object": (on(SAFETENSORS, Path.write_bytes, b"\2\0\0\0\0\0\0\0[]"), ["not a JSON object"]),
    "offsets overlap": (on(SAFETENSORS, edit_entry, W, data_offsets=[764, 49916]),
                        [f"tensor {W} starts at data byte 764, leaving an overlap"]),
    "hole between tensors": (on(SAFETENSORS, edit_entry, W, data_offsets=[772, 49924]),
                             [f"tensor {W} starts at data byte 772, leaving a gap"]),
    "unknown dtype": (on(SAFETENSORS, edit_entry, W, dtype="F33"),
                      [f"tensor {W}'s dtype is \"F33\", not a safetensors dtype"]),
    "dtype not loadable": (on(SAFETENSORS, edit_entry, W, dtype="I32"),
                           [f"tensor {W} has dtype I32, but only F32, F16 and BF16"]),
    "shape disagrees with span": (on(SAFETENSORS, edit_entry, W, shape=[64, 191]),
                                  ["needs 48,896 bytes but its data_offsets [768, 49920] span 49,152"]),
    "offsets not integers": (on(SAFETENSORS, edit_entry, W, data_offsets=[768, "end"]),
                             ["integers from 0 to 2**64 - 1"]),
    "entry lacks a field": (on(SAFETENSORS, drop_field, W, "shape"), ["needs exactly the fields"]),
    "data truncated": (on(SAFETENSORS, truncate, -4), ["holds 547,836 after its header: the file is truncated"]),
    "bytes after the last tensor": (on(SAFETENSORS, append, bytes(4)), ["unused bytes at the end"]),
    "unknown tensor name": (on(SAFETENSORS, rename_entry, "transformer.h.0.ln_1.weight", "transformer.h.0.ln_9.weight"),
                            ["tensor transformer.h.0.ln_9.weight is none of GPT-2's weights"]),
    "config disagrees": (on("config.json", edit_json, vocab_size=500), ["transformer.wte.weight has shape [512, 64]"]),
    "config lacks a key": (on("config.json", edit_json, n_positions=None), ["lacks the hyperparameter 'n_positions'"]),
    "config missing": (on("config.json", Path.unlink), ["config.json is missing"]),
    "header nested 100k deep": (on(SAFETENSORS, write_header_text, '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                                ["the header is not valid JSON (it is nested too deeply)"]),
    "a 5001-digit offset": (on(SAFETENSORS, raw_field, W, "data_offsets", "[768, 1" + "0" * 5000 + "]"),
                            ["the header is not valid JSON (a number has 5,001 digits)"]),
    "NaN in a shape": (on(SAFETENSORS, raw_field, W, "shape", "[NaN]"),
                       ["the header is not valid JSON (NaN is not a JSON value)"]),
    "a tensor named twice": (on(SAFETENSORS, repeat_tensor, "transformer.wte.weight"),
                             ["the header is not valid JSON (the key 'transformer.wte.weight' appears twice)"]),
    "dtype not a string": (on(SAFETENSORS, edit_entry, W, dtype=["F32"]),
                           [f"{W}'s dtype is an array, not a safetensors dtype"]),
    "a name with a line break": (on(SAFETENSORS, rename_entry, "transformer.h.0.ln_1.weight",
                                    "transformer.h.0.ln_1\n.weight"),
                                 ["tensor 'transformer.h.0.ln_1\\n.weight' is none of GPT-2's weights"]),
    "33 dimensions": (on(SAFETENSORS, edit_entry, W, shape=[1] * 33), ["has 33 dimensions, more than NumPy's 32"]),
    "a shape no array holds": (on(SAFETENSORS, edit_entry, W, shape=[0, 2**62]),
                               [f"{W} has shape [0, 4611686018427387904], too large for any array"]),
    "offsets past 2**64": (on(SAFETENSORS, edit_entry, W, data_offsets=[768, 2**64]), ["integers from 0 to 2**64 - 1"]),
    "a tensor named blocks": (on(SAFETENSORS, rename_entry, "transformer.ln_f.bias", "blocks"),
                              ["tensor blocks is none of GPT-2's weights"]),
    "a tensor named blocks.x": (on(SAFETENSORS, rename_entry, "transformer.ln_f.bias", "blocks.x"),
                                ["tensor blocks.x is none of GPT-2's weights"]),
    "two names for one tensor": (on(SAFETENSORS, rename_entry, "transformer.h.0.ln_2.weight", "h.0.ln_1.weight"),
                                 ["tensors transformer.h.0.ln_1.weight and h.0.ln_1.weight are both blocks/0/ln_1/g"]),
}
FOLDER_DAMAGE = {  # id: (what to make of a fresh folder path, fragments the message must contain)
    "only a pickle": (lambda d: d.mkdir() or (d / "pytorch_model.bin").write_bytes(b"\x80"),
                      ["holds only pytorch_model.bin", "never loaded", "model.safetensors instead"]),
    "empty folder": (Path.mkdir, ["holds no GPT-2 checkpoint: expected checkpoint, hparams.json"]),
    "no folder": (lambda d: None, ["absent holds no GPT-2 checkpoint"]),
}
DAMAGE = [pytest.param(fixture, damage, fragments, id=f"{fixture}: {name}")
          for fixture, cases in [("tf_tiny", TF_DAMAGE), ("hf_tiny", HF_DAMAGE), (None, FOLDER_DAMAGE)]
          for name, (damage, fragments) in cases.items()]


@pytest.mark.parametrize("verify", [False, True])
def test_an_entry_pointing_into_another_tensor_is_refused(tmp_path, verify):  # unverified, it loaded another's bytes
    folder = copy_fixture(tmp_path, "tf_tiny")
    edit_index(folder / INDEX, into_first_tensor)
    with pytest.raises(CheckpointError, match=f"{INDEX}: tensors model/h0/attn/c_attn/b and model/h0/attn/c_attn/w "
                       "overlap in data shard 0"):
        load_params(folder, verify)


def snapshot(folder):  # -> {path: bytes} of every file below folder
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("fixture, damage, fragments", DAMAGE)
def test_damaged_checkpoint_is_refused_with_a_clear_message(tmp_path, fixture, damage, fragments):
    folder = copy_fixture(tmp_path, fixture) if fixture else tmp_path / "absent"
    damage(folder)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError) as raised:
        load_params(folder, verify=True)
    for fragment in fragments:
        assert fragment in str(raised.value)
    assert snapshot(tmp_path) == before  # nothing written or modified


# --- The checkpoint file names the prefix, and a mirror controls that file: the prefix must stay in the folder ---


@pytest.fixture
def outside(tmp_path):  # -> (model folder holding only checkpoint and hparams.json, a complete tf_tiny beside it)
    other = copy_fixture(tmp_path / "other", "tf_tiny")
    folder = tmp_path / "models" / "124M"
    folder.mkdir(parents=True)
    shutil.copy(other / "hparams.json", folder)
    return folder, other


@pytest.mark.parametrize("junk", [False, True], ids=["no index or data", "junk index and data"])
@pytest.mark.parametrize("prefix, setup", [
    ("{other}/model.ckpt", None),  # absolute
    ("../../other/tf_tiny/model.ckpt", None),
    ("sub/../../../other/tf_tiny/model.ckpt", None),
    ("link/model.ckpt", lambda folder, other: (folder / "link").symlink_to(other)),  # a folder symlinked outside
    (".", lambda folder, other: [shutil.copy(other / name, folder.parent / name.replace("model.ckpt", folder.name))
                                 for name in (INDEX, DATA)]),  # "<folder>.index" is beside the folder, not in it
])
def test_a_prefix_outside_the_folder_is_refused(outside, prefix, setup, junk):
    folder, other = outside
    if setup:
        setup(folder, other)
    if junk:  # what a hostile mirror serves beside its checkpoint file
        (folder / INDEX).write_bytes(b"junk" * 100)
        (folder / DATA).write_bytes(b"junk" * 100)
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "{prefix.format(other=other)}"\n')
    with pytest.raises(CheckpointError, match=f"{folder / 'checkpoint'} names the checkpoint .* outside {folder}"):
        verify_checkpoint(folder)


def test_a_nul_byte_in_the_prefix_is_refused(tmp_path):
    folder = copy_fixture(tmp_path, "tf_tiny")
    (folder / "checkpoint").write_bytes(b'model_checkpoint_path: "model\0.ckpt"\n')
    with pytest.raises(CheckpointError, match=f"{folder / 'checkpoint'} names the checkpoint 'model\\\\x00.ckpt'"):
        load_params(folder)


def link_in(folder, other):  # the model files are symlinks to a copy elsewhere: links a user made, not a mirror
    for name in (INDEX, DATA):
        (folder / name).symlink_to(other / name)


@pytest.mark.parametrize("prefix, setup", [
    ("./model.ckpt", link_in),
    ("{folder}/model.ckpt", link_in),  # absolute, but inside the folder
    ("sub/model.ckpt", lambda folder, other: shutil.copytree(other, folder / "sub")),
    ("sub/../model.ckpt", lambda folder, other: (folder / "sub").mkdir() or link_in(folder, other)),
])
def test_a_prefix_inside_the_folder_loads(outside, prefix, setup):
    folder, other = outside
    setup(folder, other)
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "{prefix.format(folder=folder)}"\n')
    assert_same_params(load_params(folder, verify=True)[1], random_params(TINY["hparams"], TINY["seed"]))


def test_a_model_folder_reached_through_a_symlink_loads(tmp_path):
    real = copy_fixture(tmp_path, "tf_tiny")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "124M").symlink_to(real)
    (real / "checkpoint").write_text(f'model_checkpoint_path: "{real}/model.ckpt"\n')  # the real path, not the link
    assert_same_params(load_params(tmp_path / "models" / "124M")[1], random_params(TINY["hparams"], TINY["seed"]))


# --- Absurd hyperparameters: refused by comparing them with the tensors present, before anything is built ---

ABSURD = {  # id: (key, value as JSON text)
    "a million layers": ("n_layer", "1000000"), "2**40 layers": ("n_layer", str(2**40)),
    "n_embd 2**40": ("n_embd", str(2**40)), "n_ctx 2**40": ("n_ctx", str(2**40)),
    "n_vocab 2**40": ("n_vocab", str(2**40)), "n_head 2**40": ("n_head", str(2**40)),
    "5001 digits": ("n_layer", "1" + "0" * 5000), "float": ("n_layer", "2.0"), "bool": ("n_layer", "true"),
    "negative": ("n_layer", "-2"), "zero": ("n_layer", "0"), "string": ("n_layer", '"2"'), "null": ("n_layer", "null"),
    "list": ("n_layer", "[2]"), "huge float": ("n_embd", "1e308"), "NaN": ("n_layer", "NaN"),
    "nested 100k deep": ("n_layer", "[" * 100_000 + "]" * 100_000),
    "n_head zero": ("n_head", "0"), "n_embd zero": ("n_embd", "0"), "n_vocab zero": ("n_vocab", "0"),
    "n_ctx zero": ("n_ctx", "0"),
}
HF_KEYS = {"n_vocab": "vocab_size", "n_ctx": "n_positions"}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("fixture, hparams_name", [("tf_tiny", "hparams.json"), ("hf_tiny", "config.json")])
@pytest.mark.parametrize("key, value", ABSURD.values(), ids=ABSURD)
def test_absurd_hyperparameters_are_refused_at_once(tmp_path, fixture, hparams_name, key, value):
    folder = copy_fixture(tmp_path, fixture)
    path = folder / hparams_name
    name = HF_KEYS.get(key, key) if fixture == "hf_tiny" else key
    text = json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != name})
    path.write_text(text[:-1] + f', "{name}": {value}}}')
    load_params(FIXTURES / fixture)  # builds the CRC32C tables once per process (2 MB, not sized by hparams)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=f"{path}"):
            load_params(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # nothing sized by the hyperparameters was built (the weights are mapped, not read)


@pytest.mark.parametrize("hparams_name, fixture", [("hparams.json", "tf_tiny"), ("config.json", "hf_tiny")])
def test_a_repeated_hyperparameter_is_refused(tmp_path, hparams_name, fixture):
    folder = copy_fixture(tmp_path, fixture)
    path = folder / hparams_name
    path.write_text(path.read_text().rstrip()[:-1] + ', "n_head": 2, "n_head": 4}')
    with pytest.raises(CheckpointError, match=f"{path} is not valid JSON \\(the key 'n_head' appears twice\\)"):
        load_params(folder)


ZERO = {case: key for case, (key, value) in ABSURD.items() if value == "0"}  # every hyperparameter is a count or size


@pytest.mark.parametrize("fixture, hparams_name", [("tf_tiny", "hparams.json"), ("hf_tiny", "config.json")])
@pytest.mark.parametrize("key", ZERO.values(), ids=ZERO)
def test_a_zero_hyperparameter_is_refused_by_name(tmp_path, fixture, hparams_name, key):
    # a 0 that got through would divide by zero (n_head) or surface later as some tensor's shape mismatch
    folder = copy_fixture(tmp_path, fixture)
    name = HF_KEYS.get(key, key) if fixture == "hf_tiny" else key
    edit_json(folder / hparams_name, **{name: 0})
    with pytest.raises(CheckpointError, match=f"{folder / hparams_name}: the hyperparameter '{name}' must be a "
                       "positive integer, not 0;"):
        load_params(folder)


def test_a_second_name_for_a_tensor_beside_it_is_refused(tmp_path):
    # Nothing is missing here (unlike renaming a tensor): only the repeated key shows that one of the two would be lost
    folder = copy_fixture(tmp_path, "hf_tiny")
    header, data = read_safetensors_raw(folder / SAFETENSORS)
    header["h.0.ln_1.weight"] = {"dtype": "F32", "shape": [64], "data_offsets": [len(data), len(data) + 256]}
    write_safetensors_raw(folder / SAFETENSORS, header, data + np.full(64, 2.0, "<f4").tobytes())
    with pytest.raises(CheckpointError) as raised:
        load_params(folder)
    assert ("tensors transformer.h.0.ln_1.weight and h.0.ln_1.weight are both blocks/0/ln_1/g"
            in str(raised.value))


def into_two_shards(records, boundary):  # tensors at offsets >= boundary move to shard 1, at offsets from 0
    moved = []
    for key, message in records:
        fields, offset = fields_of(message), fields_of_value(message).get(4, 0)
        if not key:
            fields = set_field(fields, 1, VARINT, 2)  # BundleHeaderProto.num_shards
        elif offset >= boundary:
            fields = set_field(set_field(fields, 3, VARINT, 1), 4, VARINT, offset - boundary)  # shard_id, offset
        moved.append((key, proto(fields)))
    return moved


def test_a_checkpoint_in_two_shards_loads_exactly(tmp_path):
    # Both shards start with a tensor at offset 0: offsets only clash within one shard
    folder = copy_fixture(tmp_path, "tf_tiny")
    data = (folder / DATA).read_bytes()
    start = dict(table_records((folder / INDEX).read_bytes()))[b"model/h1/ln_1/g"]
    boundary = fields_of_value(start)[4]  # layer 1 and ln_f move to the second shard
    edit_index(folder / INDEX, lambda records: into_two_shards(records, boundary))
    (folder / DATA).unlink()
    (folder / "model.ckpt.data-00000-of-00002").write_bytes(data[:boundary])
    (folder / "model.ckpt.data-00001-of-00002").write_bytes(data[boundary:])
    hparams, params = load_params(folder, verify=True)
    assert hparams == TINY["hparams"]
    assert_same_params(params, random_params(TINY["hparams"], TINY["seed"]))


# --- Tensors GPT-2 has no use for: an output layer of its own, an optimizer's slots ---


def with_lm_head(folder, change):  # adds lm_head.weight = change(wte) to the safetensors file, as an untied model has
    header, data = read_safetensors_raw(folder / SAFETENSORS)
    begin, end = header["transformer.wte.weight"]["data_offsets"]
    lm_head = change(np.frombuffer(data[begin:end], "<f4")).astype("<f4").tobytes()
    header["lm_head.weight"] = {"dtype": "F32", "shape": header["transformer.wte.weight"]["shape"],
                                "data_offsets": [len(data), len(data) + len(lm_head)]}
    write_safetensors_raw(folder / SAFETENSORS, header, data + lm_head)


def test_an_untied_output_layer_is_refused_by_name(tmp_path):
    # the logits would be wte's (x @ wte.T), not this model's: loading it silently would give another model's output
    folder = copy_fixture(tmp_path, "hf_tiny")
    with_lm_head(folder, lambda wte: wte * 0.5)
    with pytest.raises(CheckpointError) as raised:
        load_params(folder)
    assert str(raised.value).startswith(f"{folder / SAFETENSORS}: tensor lm_head.weight differs from wte")


def test_an_output_layer_equal_to_wte_loads_as_the_tied_model(tmp_path):
    folder = copy_fixture(tmp_path, "hf_tiny")
    with_lm_head(folder, lambda wte: wte)  # as a file saved without removing the tied copy holds it
    assert_same_params(load_params(folder)[1], random_params(TINY["hparams"], TINY["seed"]))


def with_extra_tensor(folder, name):  # adds a TF tensor `name`: a copy of model/h0/ln_1/g's bytes, after the others
    data = (folder / DATA).read_bytes()

    def edit(records):
        source = dict(records)[b"model/h0/ln_1/g"]
        start, size = fields_of_value(source)[4], fields_of_value(source)[5]
        (folder / DATA).write_bytes(data + data[start : start + size])  # same bytes, so the same CRC32C
        extra = proto(set_field(fields_of(source), 4, VARINT, len(data)))
        return sorted(records + [(name.encode(), extra)])

    edit_index(folder / INDEX, edit)


@pytest.mark.parametrize("name", ["model/h0/ln_1/g/Adam", "beta1_power"])
def test_an_optimizer_slot_in_a_tf_checkpoint_is_named_as_a_tensor_the_model_does_not_use(tmp_path, name):
    folder = copy_fixture(tmp_path, "tf_tiny")
    with_extra_tensor(folder, name)
    with pytest.raises(CheckpointError) as raised:
        load_params(folder, verify=True)
    message = str(raised.value)
    assert message.startswith(f"{folder / INDEX}: tensor {name} is none of GPT-2's weights")
    assert "the checkpoint holds a tensor the model does not use" in message
    assert "hparams.json" not in message  # the hyperparameters are not at fault


def test_a_layer_beyond_the_hyperparameters_still_blames_them(tmp_path):  # the control: a real GPT-2 tensor name
    folder = copy_fixture(tmp_path, "tf_tiny")
    edit_json(folder / "hparams.json", n_layer=1)
    with pytest.raises(CheckpointError, match="has no place in a GPT-2 with .*use the hyperparameter file that came"):
        load_params(folder)


# --- config.json's options that change the math: computed as they say, or refused by name ---

OPTIONS = json.loads((FIXTURES / "config_options.json").read_text())  # scripts/fixtures/make_config_options.py


def hf_folder(tmp_path, config):  # -> a folder of hf_tiny's weights under this config.json
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copyfile(FIXTURES / "hf_tiny" / SAFETENSORS, folder / SAFETENSORS)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def assert_hugging_faces_logits(folder):
    reference = np.load(FIXTURES / "reference_tiny.npz")
    hparams, params = load_params(folder)
    assert np.abs(gpt2(reference["inputs"], **params, n_head=hparams["n_head"]) - reference["logits"]).max() \
        <= HF_TOLERANCE


@pytest.mark.parametrize("case", OPTIONS["cases"], ids=lambda case: f"{case['option']}={case['value']}")
def test_a_config_option_that_changes_transformers_logits_is_refused_by_name(tmp_path, case):
    # transformers measured how far each option moves these weights' logits: one that moves them (or reshapes the
    # weights) is refused in one line naming it, one that does not gives transformers' logits of the default config
    folder = hf_folder(tmp_path, case["config"])
    if case["logit_change"] is not None and case["logit_change"] <= HF_TOLERANCE:
        assert_hugging_faces_logits(folder)
        return
    with pytest.raises(CheckpointError) as raised:
        load_params(folder)
    message = str(raised.value)
    assert message.startswith(f"{folder / 'config.json'}: {case['option']} is {json.dumps(case['value'])}, but this "
                              "code computes only ")
    assert "\n" not in message and raised.value.files == (folder / "config.json",)


@pytest.mark.parametrize("option", OPTIONS["defaults"])
def test_a_config_without_an_option_computes_hugging_faces_default(tmp_path, option):
    config = json.loads((FIXTURES / "hf_tiny" / "config.json").read_text())
    assert config[option] == OPTIONS["defaults"][option]  # save_pretrained wrote the default: the key may go
    del config[option]
    assert_hugging_faces_logits(hf_folder(tmp_path, config))
