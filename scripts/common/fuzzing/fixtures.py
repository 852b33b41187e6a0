"""The fixtures the fuzzer damages: where each lives, how it loads, and where its tensor bytes lie."""
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from gpt2_numpy.formats.checkpoint import checkpoint_prefix, load_params, our_key
from gpt2_numpy.params import flatten
from gpt2_numpy.formats.safetensors import SafeTensor, read_safetensors, to_float32
from gpt2_numpy.formats.tf_bundle import TensorBundle, read_index

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures"
INDEX, DATA, STATE = "model.ckpt.index", "model.ckpt.data-00000-of-00001", "checkpoint"


@dataclass(frozen=True)
class Fixture:
    name: str
    source: Path  # the fixture folder, or its one file
    files: tuple  # the files the fuzzer damages
    load: object  # (folder, verify) -> {key: array}
    payload: str  # the file holding the tensor bytes
    checksummed: bool  # verify=True checks the payload's tensors against CRC32Cs
    checks_names: bool  # names and shapes are checked against hyperparameters (load_params), not only read


def load_model(folder, verify):  # -> {key path: array} of load_params
    return dict(flatten(load_params(folder, verify)[1]))


def load_bundle(folder, verify):  # -> {name: array} of the TF reader alone
    bundle = TensorBundle(checkpoint_prefix(folder))
    return {name: bundle.read(name, verify) for name in bundle.entries}


def load_safetensors(folder, verify):  # -> {name: float32 array} of the safetensors reader alone
    path = folder / "dtypes.safetensors"
    return {name: to_float32(path, name, tensor) for name, tensor in read_safetensors(path).items()}


FIXTURE_LIST = [
    Fixture("tf_tiny", FIXTURES / "tf_tiny", (INDEX, DATA, STATE), load_model, DATA, True, True),
    Fixture("tf_half", FIXTURES / "tf_half", (INDEX, DATA, STATE), load_bundle, DATA, True, False),
    Fixture("hf_tiny", FIXTURES / "hf_tiny", ("model.safetensors",), load_model, "model.safetensors", False, True),
    Fixture("hf_tiny_hub", FIXTURES / "hf_tiny_hub", ("model.safetensors",), load_model, "model.safetensors",
            False, True),
    Fixture("dtypes", FIXTURES / "dtypes.safetensors", ("dtypes.safetensors",), load_safetensors,
            "dtypes.safetensors", False, False),
]
FIXTURES_BY_NAME = {fixture.name: fixture for fixture in FIXTURE_LIST}
FORMATS = {"tf": ["tf_tiny", "tf_half"], "safetensors": ["hf_tiny", "hf_tiny_hub", "dtypes"]}


def original_files(fixture):  # -> {file name: bytes} of the undamaged fixture
    if fixture.source.is_file():
        return {fixture.source.name: fixture.source.read_bytes()}
    return {path.name: path.read_bytes() for path in sorted(fixture.source.iterdir())}


# F16 and BF16 have one size: a damaged dtype string turning one into the other leaves a valid file, read either way
OTHER_HALF = {"F16": "BF16", "BF16": "F16"}


def tensor_layout(fixture, files):  # -> {key: (offset, size, (bytes -> array, ...))}, offsets from the payload's start
    """Each tensor's converters: how its bytes may read; for a 2-byte float, as either 2-byte float."""
    key = our_key if fixture.checks_names else str
    if fixture.payload == DATA:
        tensors = {name: (entry.offset, entry.size, "F32", entry.shape)
                   for name, entry in read_index(fixture.source / INDEX)[1].items()}
    else:
        header = json.loads(header_of(files[fixture.payload])[1])
        tensors = {name: (spec["data_offsets"][0], spec["data_offsets"][1] - spec["data_offsets"][0], spec["dtype"],
                          tuple(spec["shape"])) for name, spec in header.items() if name != "__metadata__"}
    layout = {}
    for name, (offset, size, dtype, shape) in tensors.items():
        if key(name) is None:  # a tensor load_params skips
            continue
        if fixture.checks_names and len(shape) == 3 and shape[0] == 1:
            shape = shape[1:]  # load_params drops TF's leading 1 of Conv1D kernels

        dtypes = [dtype, OTHER_HALF[dtype]] if dtype in OTHER_HALF else [dtype]
        layout[key(name)] = (offset, size, tuple(partial(read_as, name, each, shape) for each in dtypes))
    return layout


def read_as(name, dtype, shape, raw):  # -> float32 array of the bytes raw, read as dtype
    return to_float32("", name, SafeTensor(dtype, shape, np.frombuffer(raw, np.uint8)))


def payload_arrays(fixture, layout, data):  # -> {key: [arrays it may load as]} from the payload's bytes, or None
    # (None: the bytes are cut off.) A safetensors payload starts after the header its own size field declares.
    start = 0 if fixture.payload == DATA else 8 + header_of(data)[0] if len(data) >= 8 else len(data) + 1
    if any(start + offset + size > len(data) for offset, size, _ in layout.values()):
        return None
    return {key: [convert(data[start + offset : start + offset + size]) for convert in converts]
            for key, (offset, size, converts) in layout.items()}


def header_of(data):  # -> (header size, JSON text)
    size = int.from_bytes(data[:8], "little")
    return size, data[8 : 8 + size]
