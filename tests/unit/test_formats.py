"""The file-format readers on real files: OpenAI's own checkpoint index, bundles written by TensorFlow, safetensors
written by the safetensors library, and CRC32C against published test vectors and a bit-by-bit reference."""
import json
import shutil
import tracemalloc

import numpy as np
import pytest

from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import crc32c as crc_module
from gpt2_numpy.formats.crc32c import crc32c, masked_crc32c
from gpt2_numpy.formats.safetensors import DTYPE_SIZES, read_safetensors, to_float32
from gpt2_numpy.formats.tf_bundle import TensorBundle, read_index, table_records
from tests.conftest import FIXTURES, official_path
from scripts.common.fuzzing.tf_index import BYTES, FIXED32, FIXED64, VARINT, fields_of, proto, set_field, table, varint

# --- CRC32C ---

RFC_3720_VECTORS = [  # RFC 3720 appendix B.4 (iSCSI), plus the customary check value of "123456789"
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"123456789", 0xE3069283),
]


def bitwise_crc32c(data):  # the definition, one bit at a time: reflected polynomial 0x82F63B78, inverted in and out
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("data, expected", RFC_3720_VECTORS)
def test_crc32c_matches_published_vectors(data, expected):
    assert crc32c(data) == expected


@pytest.mark.parametrize("block", [crc_module.BLOCK, 64])  # 64: many blocks, so chaining them is exercised too
def test_crc32c_matches_a_bitwise_reference_on_odd_lengths(monkeypatch, block):
    monkeypatch.setattr(crc_module, "BLOCK", block)
    rng = np.random.default_rng(7)
    for length in [0, 1, 3, 15, 16, 17, 31, 33, 63, 65, 127, 1001, 4099]:
        data = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
        assert crc32c(data) == bitwise_crc32c(data), length
        assert crc32c(data[length // 3 :], crc32c(data[: length // 3])) == crc32c(data), length  # continuing a CRC


def test_masked_crc32c_is_leveldbs_rotation_plus_constant():
    crc = bitwise_crc32c(b"123456789")
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


# --- TensorFlow bundles ---


def openai_shapes(hparams):  # OpenAI's variable names and shapes, written out from the GPT-2 paper's architecture
    n_embd, n_layer = hparams["n_embd"], hparams["n_layer"]
    layer = {
        "attn/c_attn/w": [1, n_embd, 3 * n_embd], "attn/c_attn/b": [3 * n_embd],
        "attn/c_proj/w": [1, n_embd, n_embd], "attn/c_proj/b": [n_embd],
        "ln_1/g": [n_embd], "ln_1/b": [n_embd], "ln_2/g": [n_embd], "ln_2/b": [n_embd],
        "mlp/c_fc/w": [1, n_embd, 4 * n_embd], "mlp/c_fc/b": [4 * n_embd],
        "mlp/c_proj/w": [1, 4 * n_embd, n_embd], "mlp/c_proj/b": [n_embd],
    }
    shapes = {f"model/h{i}/{name}": shape for i in range(n_layer) for name, shape in layer.items()}
    shapes.update({"model/ln_f/g": [n_embd], "model/ln_f/b": [n_embd], "model/wte": [hparams["n_vocab"], n_embd],
                   "model/wpe": [hparams["n_ctx"], n_embd]})
    return shapes


def test_official_index_lists_the_124m_tensors(official_124m):
    n_shards, entries = read_index(official_124m / "model.ckpt.index")  # checks every block's CRC32C on the way
    hparams = json.loads((official_124m / "hparams.json").read_text())
    assert n_shards == 1 and len(entries) == 148
    assert {name: list(entry.shape) for name, entry in entries.items()} == openai_shapes(hparams)
    assert all(entry.dtype == 1 and entry.shard_id == 0 for entry in entries.values())  # DT_FLOAT
    assert (entries["model/wte"].offset, entries["model/wte"].size) == (343_369_728, 154_389_504)
    assert sum(entry.size for entry in entries.values()) == 497_759_232
    offsets = [entries[name].offset for name in sorted(entries)]  # back to back, in byte-sorted name order
    assert offsets == [sum(entries[name].size for name in sorted(entries)[:i]) for i in range(len(entries))]


@pytest.fixture
def truncated_official(tmp_path, official_124m):  # -> prefix of the official files beside the 3 MiB data prefix
    for name in ("checkpoint", "hparams.json", "model.ckpt.index"):
        (tmp_path / name).symlink_to(official_124m / name)
    (tmp_path / "model.ckpt.data-00000-of-00001").symlink_to(official_path("truncated-124M-data-prefix-3MiB.bin"))
    return tmp_path / "model.ckpt"


def test_truncated_official_data_reads_the_tensor_it_holds(truncated_official):
    bundle = TensorBundle(truncated_official)
    bias = bundle.read("model/h0/attn/c_attn/b", verify=True)
    assert bias.shape == (2304,) and bias.dtype == np.float32 and np.isfinite(bias).all()
    assert masked_crc32c(bias.tobytes()) == bundle.entries["model/h0/attn/c_attn/b"].crc32c


def test_truncated_official_data_refuses_the_cut_tensor(truncated_official):
    # the tensor spans 9,216 + 768 * 2,304 * 4 = 7,087,104 bytes; the prefix holds 3 MiB
    with pytest.raises(CheckpointError, match=r"model.ckpt.data-00000-of-00001: tensor model/h0/attn/c_attn/w needs "
                       r"bytes 9,216 to 7,087,104 but the file ends at byte 3,145,728 \(truncated"):
        TensorBundle(truncated_official).read("model/h0/attn/c_attn/w")


def test_truncated_official_data_refuses_to_load_as_a_model(truncated_official):
    with pytest.raises(CheckpointError, match=r"tensor model/h0/attn/c_attn/w needs bytes .* \(truncated"):
        load_params(truncated_official.parent)


def test_tensorflow_written_bundle_holds_openais_names_and_shapes():
    hparams = json.loads((FIXTURES / "tf_tiny" / "hparams.json").read_text())
    bundle = TensorBundle(FIXTURES / "tf_tiny" / "model.ckpt")
    assert {name: list(bundle.read(name, verify=True).shape) for name in bundle.entries} == openai_shapes(hparams)


def test_tensorflow_written_half_precision_is_refused_by_name():
    with pytest.raises(CheckpointError, match="tensor model/wte has dtype DT_HALF, but only DT_FLOAT"):
        TensorBundle(FIXTURES / "tf_half" / "model.ckpt").read("model/wte")


# --- safetensors ---


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_safetensors_convert_like_torch(dtype):
    path = FIXTURES / "dtypes.safetensors"  # written by scripts/fixtures/make_safetensors_fixture.py with torch
    tensors = read_safetensors(path)
    assert tensors[dtype].dtype == dtype.upper()
    converted = to_float32(path, dtype, tensors[dtype])
    assert converted.dtype == np.float32
    np.testing.assert_array_equal(converted, to_float32(path, "torch's", tensors[f"{dtype}_as_f32"]))
    original = to_float32(path, "f32", tensors["f32"])
    assert np.abs(converted[:3] - original[:3]).max() > 0  # really rounded, not F32 (row 3 holds infinities and NaN)


def test_integer_safetensors_are_refused_by_name(tmp_path):
    path = tmp_path / "ints.safetensors"
    header = json.dumps({"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    with pytest.raises(CheckpointError, match="tensor ids has dtype I64, but only F32, F16 and BF16"):
        to_float32(path, "ids", read_safetensors(path)["ids"])


# --- TF index entries: only DT_FLOAT is read, whatever else an entry claims ---

DT_NAMES = {0: "DT_INVALID", 2: "DT_DOUBLE", 3: "DT_INT32", 4: "DT_UINT8", 5: "DT_INT16", 6: "DT_INT8",
            7: "DT_STRING", 8: "DT_COMPLEX64", 9: "DT_INT64", 10: "DT_BOOL", 11: "DT_QINT8", 12: "DT_QUINT8",
            13: "DT_QINT32", 14: "DT_BFLOAT16", 15: "DT_QINT16", 16: "DT_QUINT16", 17: "DT_UINT16",
            18: "DT_COMPLEX128", 19: "DT_HALF", 20: "DT_RESOURCE", 21: "DT_VARIANT", 22: "DT_UINT32",
            23: "DT_UINT64"}  # TensorFlow's types.proto; DT_FLOAT is 1
NAMED = "model/h0/attn/c_attn/b"  # the first tensor of tf_tiny's index


def entry_fields(entry, dtype=(VARINT, 1)):  # BundleEntry -> protobuf fields, with the dtype field given
    shape = proto([(2, BYTES, proto([(1, VARINT, size)])) for size in entry.shape])
    return [(1, *dtype), (2, BYTES, shape), (4, VARINT, entry.offset), (5, VARINT, entry.size),
            (6, FIXED32, entry.crc32c)]


def tf_tiny_with_entry(tmp_path, fields):  # -> tf_tiny's folder whose entry NAMED has these fields, valid CRCs
    folder = shutil.copytree(FIXTURES / "tf_tiny", tmp_path / "tf_tiny")
    records = table_records((folder / "model.ckpt.index").read_bytes())
    entry = read_index(folder / "model.ckpt.index")[1][NAMED]
    records = [(key, proto(fields(entry)) if key == NAMED.encode() else value) for key, value in records]
    (folder / "model.ckpt.index").write_bytes(table(records))
    return folder


@pytest.mark.parametrize("verify", [False, True])
def test_a_rebuilt_float_entry_loads(tmp_path, verify):  # the control: the rebuilding itself changes nothing
    folder = tf_tiny_with_entry(tmp_path, entry_fields)
    expected = TensorBundle(FIXTURES / "tf_tiny" / "model.ckpt").read(NAMED)
    np.testing.assert_array_equal(load_params(folder, verify)[1]["blocks"][0]["attn"]["c_attn"]["b"], expected)


@pytest.mark.parametrize("code", [*DT_NAMES, 24, 101, 119, 2**31, 2**64 - 1],
                         ids=lambda code: DT_NAMES.get(code, str(code)))
@pytest.mark.parametrize("verify", [False, True])
def test_every_dtype_but_float_is_refused_by_name(tmp_path, code, verify):
    folder = tf_tiny_with_entry(tmp_path, lambda entry: entry_fields(entry, (VARINT, code)))
    name = DT_NAMES.get(code, f"number {code}")
    with pytest.raises(CheckpointError, match=f"model.ckpt.index: tensor {NAMED} has dtype {name}, but only DT_FLOAT"):
        load_params(folder, verify)


@pytest.mark.parametrize("field, wire_type, value", [
    (1, BYTES, b"\1"), (1, FIXED32, 1), (1, FIXED64, 1),  # a float dtype in the wrong wire type is no DT_FLOAT
    (2, VARINT, 7), (4, BYTES, b"\0"), (5, FIXED32, 768), (6, VARINT, 5),
], ids=["dtype bytes", "dtype fixed32", "dtype fixed64", "shape varint", "offset bytes", "size fixed32",
        "crc varint"])
def test_an_entry_field_of_the_wrong_wire_type_is_refused(tmp_path, field, wire_type, value):
    def fields(entry):
        return [(number, *((wire_type, value) if number == field else rest)) for number, *rest in entry_fields(entry)]

    folder = tf_tiny_with_entry(tmp_path, fields)
    with pytest.raises(CheckpointError, match=f"model.ckpt.index: not a valid TensorFlow checkpoint index: field "
                       f"{field} \\(\\w+\\) of tensor {NAMED} has wire type {wire_type}, not"):
        load_params(folder)


@pytest.mark.parametrize("dtype", ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "I32", "U32", "I64", "U64",
                                   "F64"])
def test_every_safetensors_dtype_but_f32_f16_bf16_is_refused(tmp_path, dtype):
    path = tmp_path / "one.safetensors"
    size = DTYPE_SIZES[dtype] * 4
    header = json.dumps({"x": {"dtype": dtype, "shape": [4], "data_offsets": [0, size]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(size))
    with pytest.raises(CheckpointError, match=f"tensor x has dtype {dtype}, but only F32, F16 and BF16"):
        to_float32(path, "x", read_safetensors(path)["x"])


def test_an_index_whose_keys_expand_hugely_is_refused_without_expanding_them(tmp_path):
    # Prefix compression: each record repeats all of the key before it and adds a byte, so 300 records of 4 bytes
    # after one 100 kB key stand for 30 MB of keys. A reader that builds them all first uses 100 times the file.
    records = [b"\0" + varint(100_000) + b"\0" + b"k" * 100_000]
    records += [varint(100_000 + i) + b"\1\0a" for i in range(300)]
    crafted = b"".join(records) + (0).to_bytes(4, "little") + (1).to_bytes(4, "little")  # one restart point, at 0
    path = tmp_path / "model.ckpt.index"
    path.write_bytes(table([(b"", b""), (b"a", b"")], edit_block=lambda kind, block: crafted if kind == "data" else
                           block))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="model.ckpt.index: not a valid TensorFlow checkpoint index: its keys "
                           "expand to over"):
            read_index(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 2**20  # the keys would take 30 MB


def tf_tiny_rebuilt(tmp_path, edit_records, edit_block=None):  # -> tf_tiny's folder, its index rebuilt, valid CRCs
    folder = shutil.copytree(FIXTURES / "tf_tiny", tmp_path / "tf_tiny")
    records = edit_records(table_records((folder / "model.ckpt.index").read_bytes()))
    (folder / "model.ckpt.index").write_bytes(table(records, edit_block=edit_block))
    return folder


@pytest.mark.parametrize("verify", [False, True])
def test_an_entry_size_that_disagrees_with_its_shape_is_refused(tmp_path, verify):
    # float32 [64] is 4 * 64 = 256 bytes; 252 used to reach NumPy's reshape (or the CRC check) unexplained
    def smaller(records):
        return [(key, proto(set_field(fields_of(value), 5, VARINT, 252)) if key == b"model/h0/ln_1/g" else value)
                for key, value in records]

    folder = tf_tiny_rebuilt(tmp_path, smaller)
    with pytest.raises(CheckpointError, match=r"model.ckpt.index: tensor model/h0/ln_1/g has 252 bytes but float32 of "
                       r"shape \[64\] needs 256"):
        load_params(folder, verify)


def test_a_record_sharing_more_than_the_previous_key_is_refused(tmp_path):
    # The first record of a block has no previous key: "shares 1 byte" with b"" is damage. Read leniently it would
    # still spell the header's empty key, and the index would load.
    def first_shares_one(kind, block):
        assert block[0] == 0  # shared = 0, as the header's record is written
        return b"\1" + block[1:] if kind == "data" else block

    folder = tf_tiny_rebuilt(tmp_path, list, first_shares_one)
    with pytest.raises(CheckpointError, match="model.ckpt.index: not a valid TensorFlow checkpoint index"):
        load_params(folder)


@pytest.mark.parametrize("name_length", range(1, 9))  # every remainder of the header's length modulo 8
def test_written_safetensors_data_starts_8_byte_aligned(tmp_path, name_length):
    # the safetensors library's own writer (safetensors.numpy.save) pads the JSON header with spaces (0x20, which the
    # format allows after the JSON) so that the byte buffer starts at a multiple of 8, for every length of the names:
    # arrays mapped from the file are then aligned for every dtype
    from io import BytesIO

    from gpt2_numpy.formats.safetensors import write_safetensors

    tensors = {"x" * name_length: np.arange(3, dtype=np.float32), "y": np.ones((2, 2), np.float32)}
    out = BytesIO()
    write_safetensors(out, tensors, {"format": "pt"})
    data = out.getvalue()
    header_size = int.from_bytes(data[:8], "little")
    assert (8 + header_size) % 8 == 0
    header = data[8 : 8 + header_size]
    assert header.rstrip(b" ").endswith(b"}")  # the JSON object, then spaces alone
    assert json.loads(header)["y"]["data_offsets"] == [12, 28]  # 3 float32 before it, 4 in it
    assert data[8 + header_size :] == tensors["x" * name_length].tobytes() + tensors["y"].tobytes()
    (tmp_path / "m.safetensors").write_bytes(data)  # and our reader takes it back
    read = read_safetensors(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(to_float32(tmp_path / "m.safetensors", "y", read["y"]), tensors["y"])
