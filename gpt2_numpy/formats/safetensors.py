"""safetensors files (Hugging Face's pickle-free format), read and fully validated with NumPy and json.

Layout: a little-endian u64 header size N, N bytes of JSON (maybe space-padded) mapping each tensor name to its dtype,
shape and data_offsets [begin, end) relative to the byte buffer that follows, plus an optional "__metadata__" map.
The tensors must tile that buffer exactly: no holes, no overlaps, each span as long as its shape and dtype demand.
"""
import json
import math
from dataclasses import dataclass

import numpy as np

from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import check_shape, corrupt, describe, map_file, parse_json, shown

HEADER_LIMIT = 100 * 2**20  # refuse to parse absurd headers: a damaged size field could ask for gigabytes
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class SafeTensor:
    dtype: str
    shape: tuple
    data: np.ndarray  # uint8 view of the tensor's bytes


def read_safetensors(path):  # -> {name: SafeTensor}, after checking the whole file against the spec
    buffer = map_file(path)
    if len(buffer) < 8:
        raise corrupt(path, f"the file has {len(buffer)} bytes, too few for a safetensors header size (truncated?)")
    header_size = int.from_bytes(buffer[:8], "little")
    if header_size > HEADER_LIMIT:
        raise corrupt(path, f"the header declares {header_size:,} bytes, over the {HEADER_LIMIT:,}-byte limit")
    if 8 + header_size > len(buffer):
        raise corrupt(path, f"the {header_size:,}-byte header runs past the end of the {len(buffer):,}-byte file "
                      "(truncated, or not a safetensors file)")
    specs = parse_specs(path, buffer[8 : 8 + header_size])
    data_start = 8 + header_size
    check_tiling(path, specs, len(buffer) - data_start)
    return {name: SafeTensor(dtype, tuple(shape), np.frombuffer(buffer, np.uint8, end - begin, data_start + begin))
            for name, (dtype, shape, (begin, end)) in specs.items()}


def to_float32(path, name, tensor):  # -> float32 array: F32 stays a view, F16 and BF16 are converted
    if tensor.dtype == "F32":
        return tensor.data.view("<f4").reshape(tensor.shape)
    if tensor.dtype == "F16":
        return tensor.data.view("<f2").astype(np.float32).reshape(tensor.shape)
    if tensor.dtype == "BF16":  # bfloat16 is the top half of a float32: shift it back into place
        return (tensor.data.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(tensor.shape)
    raise CheckpointError(f"{path}: tensor {shown(name)} has dtype {tensor.dtype}, but only F32, F16 and BF16 weights "
                          "can be loaded; convert the checkpoint to one of those", files=(path,))


def parse_specs(path, header):  # JSON bytes -> {name: (dtype, shape, data_offsets)}, each checked
    try:
        entries = parse_json(header.decode())  # strict UTF-8, as the format demands
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors too
        raise corrupt(path, f"the header is not valid JSON ({error})") from None
    if not isinstance(entries, dict):
        raise corrupt(path, "the header is not a JSON object")
    entries.pop("__metadata__", None)  # free-form strings, e.g. {"format": "pt"}
    return {name: parse_spec(path, name, entry) for name, entry in entries.items()}


def parse_spec(path, name, entry):  # -> (dtype, shape, (begin, end))
    if not isinstance(entry, dict) or entry.keys() != {"dtype", "shape", "data_offsets"}:
        raise corrupt(path, f"tensor {shown(name)} needs exactly the fields dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if type(dtype) is not str or dtype not in DTYPE_SIZES:
        raise corrupt(path, f"tensor {shown(name)}'s dtype is {describe(dtype)}, not a safetensors dtype")
    if not is_int_list(shape) or not is_int_list(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise corrupt(path, f"tensor {shown(name)} needs a shape and data_offsets [begin, end] of integers from 0 to "
                      "2**64 - 1")
    check_shape(path, name, shape, DTYPE_SIZES[dtype])
    needed = math.prod(shape) * DTYPE_SIZES[dtype]
    if offsets[1] - offsets[0] != needed:
        raise corrupt(path, f"tensor {shown(name)} of shape {shape} and dtype {dtype} needs {needed:,} bytes but its "
                      f"data_offsets {offsets} span {offsets[1] - offsets[0]:,}")
    return dtype, shape, tuple(offsets)


def is_int_list(value):  # sizes are u64 in the format; bool is an int subclass in Python, but never a valid size
    return isinstance(value, list) and all(type(item) is int and 0 <= item < 2**64 for item in value)


def check_tiling(path, specs, buffer_size):  # the tensors must cover the data buffer exactly once
    position, previous = 0, "the header"
    for name, (_, _, (begin, end)) in sorted(specs.items(), key=lambda item: item[1][2]):
        if begin != position:
            gap = "a gap" if begin > position else "an overlap"
            raise corrupt(path, f"tensor {shown(name)} starts at data byte {begin:,}, leaving {gap} after {previous} "
                          f"(which ends at {position:,})")
        position, previous = end, f"tensor {shown(name)}"
    if position != buffer_size:
        problem = "the file is truncated" if position > buffer_size else "there are unused bytes at the end"
        raise corrupt(path, f"the tensors need {position:,} data bytes but the file holds {buffer_size:,} "
                      f"after its header: {problem}")


def write_safetensors(file, tensors, metadata=None):  # {name: float32 array}, {str: str} -> None, into a binary file
    """Write float32 tensors in safetensors layout, in the given order; the header is space-padded to a multiple of 8
    bytes, as Hugging Face's writer does, so every tensor starts 8-byte aligned."""
    arrays = {name: np.ascontiguousarray(array, dtype="<f4") for name, array in tensors.items()}
    header, position = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, array in arrays.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [position, position + array.nbytes]}
        position += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    file.write(len(text).to_bytes(8, "little") + text)
    for array in arrays.values():
        file.write(memoryview(array).cast("B"))  # the array's own bytes, not a copy


def read_metadata(path):  # -> the header's "__metadata__" map ({} if none), after checking the whole file
    buffer = map_file(path)
    read_safetensors(path)  # every check the reader makes; the header is then known to be sound
    return parse_json(bytes(buffer[8 : 8 + int.from_bytes(buffer[:8], "little")])).get("__metadata__", {})
