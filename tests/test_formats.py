"""The file-format readers on real files: OpenAI's own checkpoint index, bundles written by TensorFlow, safetensors
written by the safetensors library, and CRC32C against published test vectors and a bit-by-bit reference."""
import json

import numpy as np
import pytest

from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import crc32c as crc_module
from gpt2_numpy.formats.crc32c import crc32c, masked_crc32c
from gpt2_numpy.formats.safetensors import read_safetensors, to_float32
from gpt2_numpy.formats.tf_bundle import TensorBundle, read_index
from tests.conftest import FIXTURES, official_path

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
    path = FIXTURES / "dtypes.safetensors"  # written by scripts/make_safetensors_fixture.py with torch
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
