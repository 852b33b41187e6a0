"""Seeded random damage to the checkpoint fixtures, and the rule every damaged file must obey.

Each case mutates one file of a fixture (tests/fixtures/tf_tiny, tf_half, hf_tiny, hf_tiny_hub, dtypes.safetensors) and
loads the fixture again: through load_params for model folders, through the format's reader for the others. The load
must either
- return exactly the arrays expected: the original ones, or, when only tensor bytes that no checksum covers changed
  (safetensors; a TF data file read without verify), those tensor bytes as they now are; or
- raise CheckpointError naming the damaged file (an index may also be blamed through the data file it describes),
  unless the mutation only re-encodes the same tensors validly, which must load;
and never raise anything else, take over a second, or allocate more than a small multiple of the files' size.
tests/test_fuzz_formats.py runs a fixed number of cases per format; scripts/fuzz_formats.py runs as many as asked.
"""
import json
import math
import random
import shutil
import time
import tracemalloc
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from gpt2_numpy.checkpoint import checkpoint_prefix, load_params, our_key
from gpt2_numpy.params import flatten
from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats.crc32c import masked_crc32c
from gpt2_numpy.formats.safetensors import SafeTensor, read_safetensors, to_float32
from gpt2_numpy.formats.tf_bundle import TABLE_MAGIC, TensorBundle, read_handle, read_index, read_varint, table_records

FIXTURES = Path(__file__).resolve().parent / "fixtures"
INDEX, DATA, STATE = "model.ckpt.index", "model.ckpt.data-00000-of-00001", "checkpoint"
SECONDS_LIMIT = 1.0  # per load: every fixture loads in milliseconds, so this only catches runaway work
MEMORY_FACTOR, MEMORY_SLACK = 4, 2**20  # peak allocation allowed: 4x the files' bytes, plus 1 MiB for small files

# --- Writing LevelDB tables and protobuf messages (the TF index), so mutated indexes can carry valid CRCs ---

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5  # protobuf wire types
TF_BLOCK_SIZE = 262144  # TensorFlow's table::Options: block_size, block_restart_interval (LevelDB's defaults differ)
TF_RESTART_INTERVAL = 16


def varint(value):  # int >= 0 -> varint bytes: 7 bits a byte, low bits first
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def proto(fields):  # [(field number, wire type, int or bytes)] -> protobuf message bytes
    out = bytearray()
    for number, wire_type, value in fields:
        out += varint(number << 3 | wire_type)
        if wire_type == VARINT:
            out += varint(value)
        elif wire_type == BYTES:
            out += varint(len(value)) + value
        else:
            width = 8 if wire_type == FIXED64 else 4
            out += (value % 2 ** (8 * width)).to_bytes(width, "little")
    return bytes(out)


def block(records, restart_interval):  # [(key, value)] -> block contents: prefix-compressed records, restart array
    out, restarts, previous = bytearray(), [], b""
    for i, (key, value) in enumerate(records):
        shared = 0
        if i % restart_interval:
            while shared < min(len(key), len(previous)) and key[shared] == previous[shared]:
                shared += 1
        else:
            restarts.append(len(out))
        out += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
        previous = key
    restarts = restarts or [0]  # LevelDB's empty block still lists one restart point
    return bytes(out) + b"".join(r.to_bytes(4, "little") for r in restarts + [len(restarts)])


def separator(start, limit):  # LevelDB's FindShortestSeparator: a short key in [start, limit)
    n = 0
    while n < min(len(start), len(limit)) and start[n] == limit[n]:
        n += 1
    if n < min(len(start), len(limit)) and start[n] < 0xFF and start[n] + 1 < limit[n]:
        return start[:n] + bytes([start[n] + 1])
    return start


def successor(key):  # LevelDB's FindShortSuccessor: a short key >= key
    for n, byte in enumerate(key):
        if byte != 0xFF:
            return key[:n] + bytes([byte + 1])
    return key


def table(records, block_size=TF_BLOCK_SIZE, restart_interval=TF_RESTART_INTERVAL, edit_block=None, footer=None,
          compression=0):  # -> bytes of a LevelDB table holding records, as TensorFlow's BundleWriter lays it out
    """edit_block(kind, contents) may change each block ("data", "meta", "index") before its CRC is computed;
    footer=(metaindex handle, index handle) overrides the handles the footer stores."""
    out, index = bytearray(), []

    def write_block(kind, contents):  # -> (offset, size) handle
        contents = edit_block(kind, contents) if edit_block else contents
        handle = (len(out), len(contents))
        typed = contents + bytes([compression])
        out.extend(typed + masked_crc32c(typed).to_bytes(4, "little"))
        return handle

    pending = []
    for i, record in enumerate(records):
        pending.append(record)
        if len(block(pending, restart_interval)) >= block_size or i == len(records) - 1:  # LevelDB's size estimate
            last = pending[-1][0]
            handle = write_block("data", block(pending, restart_interval))
            key = successor(last) if i == len(records) - 1 else separator(last, records[i + 1][0])
            index.append((key, varint(handle[0]) + varint(handle[1])))
            pending = []
    meta = write_block("meta", block([], restart_interval))
    index_handle = write_block("index", block(index, 1))  # LevelDB indexes with a restart at every entry
    meta, index_handle = footer or (meta, index_handle)
    handles = b"".join(varint(n) for n in (*meta, *index_handle))
    return bytes(out) + handles.ljust(40, b"\0") + TABLE_MAGIC.to_bytes(8, "little")



def fields_of(message):  # protobuf bytes -> [(field number, wire type, int or bytes)], for undamaged messages
    fields, pos = [], 0
    while pos < len(message):
        tag, pos = read_varint(message, pos)
        if tag & 7 == VARINT:
            value, pos = read_varint(message, pos)
        elif tag & 7 == BYTES:
            size, pos = read_varint(message, pos)
            value, pos = message[pos : pos + size], pos + size
        else:
            width = 8 if tag & 7 == FIXED64 else 4
            value, pos = int.from_bytes(message[pos : pos + width], "little"), pos + width
        fields.append((tag >> 3, tag & 7, value))
    return fields


def fields_of_value(message):  # -> {field number: value}, the last of each, as protobuf keeps
    return {number: value for number, _, value in fields_of(message)}


def entry_fields(entry, dtype=(VARINT, 1)):  # BundleEntry -> BundleEntryProto fields as TF writes them, dtype given
    shape = proto([(2, BYTES, proto([(1, VARINT, size)])) for size in entry.shape])
    return [(1, *dtype), (2, BYTES, shape), (4, VARINT, entry.offset), (5, VARINT, entry.size),
            (6, FIXED32, entry.crc32c)]


# --- Byte mutations of any file: each takes (rng, data, (start, end)) and returns (new data, description) ---


def awkward_integers(data):  # -> values a damaged size, count or offset likes to hold
    return [0, 1, 2, 7, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1,
            2**63, 2**64 - 1, len(data) - 1, len(data), len(data) + 1]


def flip_bits(rng, data, region):
    out = bytearray(data)
    positions = sorted(rng.randrange(*region) for _ in range(rng.choice([1, 1, 2, 8])))
    for position in positions:
        out[position] ^= 1 << rng.randrange(8)
    return bytes(out), f"bits flipped at {positions}"


def overwrite_run(rng, data, region):
    start = rng.randrange(*region)
    length = min(rng.choice([1, 2, 4, 8, 16, 64]), len(data) - start)
    fill = rng.choice(["random", "zeros", "ones", "copied"])
    if fill == "copied":  # bytes from elsewhere in the file: plausible structure in the wrong place
        source = rng.randrange(len(data) - length + 1)
        run = data[source : source + length]
    else:
        run = {"random": rng.randbytes(length), "zeros": bytes(length), "ones": b"\xff" * length}[fill]
    return data[:start] + run + data[start + length :], f"{length} bytes at {start} overwritten ({fill})"


def insert_bytes(rng, data, region):
    start = rng.randrange(region[0], region[1] + 1)
    run = rng.choice([rng.randbytes(rng.choice([1, 3, 16])), b"\0", b" ", data[start : start + 40]])
    return data[:start] + run + data[start:], f"{len(run)} bytes inserted at {start}"


def delete_run(rng, data, region):
    start, length = rng.randrange(*region), rng.choice([1, 2, 5, 40])
    return data[:start] + data[start + length :], f"{length} bytes deleted at {start}"


def truncate(rng, data, region):
    size = rng.randrange(*region)
    return data[:size], f"truncated to {size} bytes"


def append_bytes(rng, data, region):
    run = rng.choice([b"\0", rng.randbytes(rng.choice([1, 100])), data[-48:]])
    return data + run, f"{len(run)} bytes appended"


def integer_over(rng, data, region):  # a little-endian integer or a varint of an awkward value written over bytes
    start, value = rng.randrange(*region), rng.choice(awkward_integers(data))
    if rng.random() < 0.5:
        width = rng.choice([1, 2, 4, 8])
        field, kind = (value % 2 ** (8 * width)).to_bytes(width, "little"), f"{width}-byte integer"
    else:
        field, kind = varint(value), "varint"
    return data[:start] + field + data[start + len(field) :], f"{kind} {value} written at {start}"


BYTE_MUTATIONS = [flip_bits, overwrite_run, insert_bytes, delete_run, truncate, append_bytes, integer_over]


def mutate_bytes(rng, data, region=None):  # -> (data changed by one random byte mutation, description)
    region = region or (0, len(data))
    if region[0] >= region[1]:
        return data + b"\0", "a zero byte appended"
    return rng.choice(BYTE_MUTATIONS)(rng, data, region)


# --- The fixtures: how each loads, and where its tensor bytes lie ---


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


# --- safetensors: the size field, the JSON header as text and as structure ---


def header_of(data):  # -> (header size, JSON text)
    size = int.from_bytes(data[:8], "little")
    return size, data[8 : 8 + size]


def with_header(text, data):  # -> the file with its header replaced by text, the size field matching it
    size, _ = header_of(data)
    return len(text).to_bytes(8, "little") + text + data[8 + size :]


def st_bytes(rng, target, context):  # a byte mutation anywhere, mostly in the size field and header
    size, _ = header_of(target.data)
    region = (0, 8 + size) if rng.random() < 0.7 else None
    return (*mutate_bytes(rng, target.data, region), False)


def st_size_field(rng, target, context):
    size, _ = header_of(target.data)
    value = rng.choice(awkward_integers(target.data) + [size - 1, size + 1, 100 * 2**20, 100 * 2**20 + 1])
    return value.to_bytes(8, "little") + target.data[8:], f"header size field set to {value}", False


def st_header_text(rng, target, context):  # a byte mutation of the JSON text, with the size field kept in step
    _, text = header_of(target.data)
    text, description = mutate_bytes(rng, text)
    return with_header(text, target.data), f"header text: {description}", False


def st_reencode(rng, target, context):  # the same tensors in other valid JSON: spacing, order, padding, metadata
    header = json.loads(header_of(target.data)[1])
    if "__metadata__" in header and rng.random() < 0.3:
        header["__metadata__"] = rng.choice([{}, {"format": "np"}, {"format": "pt", "note": "x" * 100}])
    items = list(header.items())
    rng.shuffle(items)
    text = json.dumps(dict(items), indent=rng.choice([None, 0, 2, "\t"]),
                      separators=rng.choice([None, (",", ":"), (" , ", " : ")]), ensure_ascii=rng.random() < 0.5)
    padding = rng.choice(["", " " * rng.randrange(1, 9), "\n", " \t\r\n"])
    return with_header(text.encode() + padding.encode(), target.data), "header re-encoded", True


JUNK = ["null", "true", "false", "0", "-1", "1.5", "-0.0", "1e400", '""', '"F32"', "[]", "{}", "[[]]", '{"a": 1}',
        "NaN", "Infinity", "-Infinity", "1" + "0" * 5000, str(2**64), str(2**63), '"\\u0000"', '"\\ud800"',
        "[" * 50 + "]" * 50]
SHAPE_JUNK = ["[64.0]", "[-1]", "[true]", '["64"]', "[null]", "[[64]]", f"[{2**64}]", f"[{2**64 - 1}]",
              f"[{2**63 - 1}, 0]", f"[0, {2**64 - 1}]", f"[0, {2**62}, 4]", "[" + ",".join(["1"] * 33) + "]",
              "[" + ",".join(["1"] * 100_000) + "]", "[" + ",".join(["2"] * 64) + "]"]
OFFSET_JUNK = ["[0]", "[0, 0, 0]", "[4, 0]", "[-4, 0]", "[0.0, 4.0]", "[true, 4]", f"[0, {2**64}]",
               f"[{2**64 - 1}, {2**64 - 1}]", f"[{2**64 - 4}, {2**64}]", f"[0, {10**20}]", "[0, 1e3]"]
DEPTHS = [2, 100, 900, 1100, 5000, 100_000]  # the JSON decoder recurses once a level: about 1,000 overflow it
DTYPE_NAMES = ["F32", "F16", "BF16", "F64", "I32", "U32", "I64", "U8", "BOOL", "F8_E4M3", "f32", "F 32", ""]


def nested(rng):  # -> JSON text of lists or objects nested an awkward depth
    depth = rng.choice(DEPTHS)
    return rng.choice(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth])


def json_object(pairs):  # [(key, JSON text)] -> JSON text of an object; keys may repeat
    return "{" + ", ".join(f"{json.dumps(key)}: {value}" for key, value in pairs) + "}"


def with_pair(pairs, key, value):  # -> pairs with key's value replaced, or the pair appended
    return [pair for pair in pairs if pair[0] != key] + [(key, value)]


def shape_change(rng, shape, same_size):  # -> another shape: the same element count when same_size
    if same_size and len(shape) > 1:
        return rng.choice([shape[::-1], [math.prod(shape)], [1, *shape], shape + [1]])
    if same_size:
        return [1, *shape]
    i = rng.randrange(len(shape)) if shape else 0
    return rng.choice([shape[:i] + [shape[i] + 1] + shape[i + 1 :] if shape else [2], shape[:i] + shape[i + 1 :],
                       shape + [2], [0, *shape], [2 * n for n in shape]])


def st_header_edit(rng, target, context):  # one structured change to the JSON header, e.g. a field of a wrong type
    header = json.loads(header_of(target.data)[1])
    pairs = [(name, {field: json.dumps(value) for field, value in entry.items()} if name != "__metadata__"
              else json.dumps(entry)) for name, entry in header.items()]
    names = [i for i, (name, _) in enumerate(pairs) if name != "__metadata__"]
    i = rng.choice(names)
    name, entry = pairs[i]
    spec = header[name]
    change = rng.choice(["field", "dtype", "shape", "offsets", "drop field", "extra field", "repeat field",
                         "repeat tensor", "rename", "nested", "metadata", "top level"])
    field = rng.choice(["dtype", "shape", "data_offsets"])
    if change == "field":
        entry[field] = rng.choice(JUNK + (SHAPE_JUNK if field == "shape" else OFFSET_JUNK))
    elif change == "dtype":
        entry["dtype"] = json.dumps(rng.choice(DTYPE_NAMES))
    elif change == "shape":  # the same size only where load_params checks shapes: otherwise it is a valid file
        entry["shape"] = json.dumps(shape_change(rng, spec["shape"], target.fixture.checks_names and rng.random() < .5))
    elif change == "offsets":
        begin, end = spec["data_offsets"]
        step = rng.choice([1, 4, end - begin])
        entry["data_offsets"] = json.dumps(rng.choice([[begin + step, end + step], [begin - step, end - step],
                                                       [begin, end + step], [end, begin], [begin, begin]]))
    elif change == "drop field":
        del entry[field]
    elif change == "extra field":
        entry[rng.choice(["x", "dtype ", "offsets"])] = rng.choice(JUNK)
    if change in ("field", "dtype", "shape", "offsets", "drop field", "extra field"):
        pairs[i] = (name, json_object(entry.items()))
    elif change == "repeat field":
        pairs[i] = (name, json_object([*entry.items(), (field, rng.choice([entry[field], *JUNK]))]))
    elif change == "repeat tensor":
        pairs.insert(rng.randrange(len(pairs) + 1), (name, json_object(entry.items())))
    elif change == "rename":  # where only the reader runs, any new name is valid: then only clashes count
        other = pairs[rng.choice(names)][0]
        new = rng.choice(["", "\n", "\0", "__metadata__", other, name + "\ud800", name.replace(".", "/", 1),
                          mutate_bytes(rng, name.encode())[0].decode(errors="replace")]
                         if target.fixture.checks_names else [other, "__metadata__"])
        pairs[i] = (new, json_object(entry.items()))
    elif change == "nested":
        where = rng.choice(["entry", "field", "new key", "metadata"])
        if where == "entry":
            pairs[i] = (name, nested(rng))
        elif where == "field":
            pairs[i] = (name, json_object([*((k, v) for k, v in entry.items() if k != field), (field, nested(rng))]))
        else:
            pairs = with_pair(pairs, "__metadata__" if where == "metadata" else "junk", nested(rng))
    elif change == "metadata":  # free-form: ignored, whatever it holds
        pairs = with_pair(pairs, "__metadata__", rng.choice(JUNK))
    if change == "top level":
        text = rng.choice(JUNK + [nested(rng)])
    else:
        text = json_object((key, value if isinstance(value, str) else json_object(value.items()))
                           for key, value in pairs)
    description = f"header: {change} ({field}) of tensor {name!r}" if change != "top level" else "header: not an object"
    return with_header(text.encode(errors="surrogatepass"), target.data), description, False


# --- TF index: records and messages changed, then written as a table with valid CRCs; or raw bytes ---

DTYPE_CODES = [0, *range(2, 25), 101, 119, 2**31, 2**64 - 1]  # every TF dtype but DT_FLOAT (1), refs, absurd ones


def set_field(fields, number, wire_type, value):  # -> fields with the (first) field number replaced, or appended
    for i, (existing, *_) in enumerate(fields):
        if existing == number:
            return fields[:i] + [(number, wire_type, value)] + fields[i + 1 :]
    return fields + [(number, wire_type, value)]


def retyped(field, rng):  # -> the field in another wire type, its value converted
    number, wire_type, value = field
    new = rng.choice([t for t in (VARINT, FIXED64, BYTES, FIXED32) if t != wire_type])
    if new == BYTES:
        return number, new, varint(value) if isinstance(value, int) else value
    return number, new, len(value) if isinstance(value, bytes) else value


def edit_shape(rng, shape_message):  # -> (TensorShapeProto with one change, description, must load)
    dims = [dict((n, v) for n, _, v in fields_of(dim)).get(1, 0) for _, _, dim in fields_of(shape_message)]
    change = rng.choice(["dim", "drop dim", "add dim", "many dims", "scalar", "unknown rank", "dim name", "dim type"])
    extra, named, must_load = [], False, False
    if change == "dim" and dims:
        i = rng.randrange(len(dims))
        dims[i] = rng.choice([0, dims[i] - 1, dims[i] + 1, 2 * dims[i], 2**40, 2**63 - 1, 2**63, 2**64 - 1])
    elif change == "drop dim" and dims:
        dims.pop(rng.randrange(len(dims)))
    elif change == "add dim":
        dims.insert(rng.randrange(len(dims) + 1), rng.choice([1, 2, 0]))
    elif change == "many dims":
        dims = [1] * rng.choice([33, 65, 5000]) + dims
    elif change == "scalar":
        dims = []
    elif change == "unknown rank":
        extra = [(3, VARINT, 1)]
    elif change == "dim name":  # TensorShapeProto.Dim.name: allowed, and ignored
        named, must_load = True, True
    if change == "dim type":
        message = proto([(2, BYTES, proto([(1, BYTES, varint(size))])) for size in dims])
    else:
        message = proto([(2, BYTES, proto([(1, VARINT, size)] + [(2, BYTES, b"x")] * named)) for size in dims] + extra)
    return message, f"shape {change}: {dims[:8]}{'...' if len(dims) > 8 else ''}", must_load


def edit_entry(rng, fields, offsets):  # -> (BundleEntryProto fields with one change, description, must load)
    change = rng.choice(["dtype", "shard_id", "offset", "size", "crc32c", "shape", "drop", "repeat", "wire type",
                         "unknown field", "slices"])
    numbers = {"dtype": 1, "shard_id": 3, "offset": 4, "size": 5}
    values = dict((number, value) for number, _, value in fields)
    if change == "dtype":
        value = rng.choice(DTYPE_CODES)
    elif change == "shard_id":
        value = rng.choice([1, 2, 2**31, 2**32 - 1, 2**64 - 1])
    elif change in ("offset", "size"):
        old = values.get(numbers[change], 0)
        value = rng.choice([old + 1, old - 1, old + 4, max(old - 4, 0), 2 * old, 0, *offsets, 2**40, 2**63,
                            2**64 - 1])
    if change in numbers:
        return set_field(fields, numbers[change], VARINT, max(value, 0)), f"{change} set to {value}", False
    if change == "crc32c":
        return set_field(fields, 6, FIXED32, rng.getrandbits(32)), "crc32c changed", False
    if change == "shape":
        shape, description, must_load = edit_shape(rng, values.get(2, b""))
        return set_field(fields, 2, BYTES, shape), description, must_load
    i = rng.randrange(len(fields))
    if change == "drop":
        return fields[:i] + fields[i + 1 :], f"field {fields[i][0]} dropped", False
    if change == "repeat":  # protobuf keeps the last value of a repeated scalar field
        number, wire_type, value = fields[i]
        other = rng.choice([3, 0, 2**33]) if wire_type == VARINT else value
        return fields + [(number, wire_type, other)], f"field {number} repeated with {other!r:.20}", False
    if change == "wire type":
        return fields[:i] + [retyped(fields[i], rng)] + fields[i + 1 :], f"field {fields[i][0]} retyped", False
    if change == "unknown field":  # unknown fields are skipped, as protobuf does: the tensors must still load
        wire_type = rng.choice([VARINT, FIXED64, BYTES, FIXED32])
        field = (rng.randrange(8, 40), wire_type, b"junk" if wire_type == BYTES else 12345)
        return fields + [field], f"unknown field {field[0]} added", True
    return fields + [(7, BYTES, proto([(1, VARINT, 1)]))], "a slice added (a partitioned tensor)", False


def edit_header(rng, fields):  # -> (BundleHeaderProto fields with one change, description, must load)
    change = rng.choice(["num_shards", "endianness", "version", "drop", "wire type", "unknown field"])
    if change == "num_shards":
        value = rng.choice([0, 2, 3, 2**31, 2**32 - 1, 2**64 - 1])
        return set_field(fields, 1, VARINT, value), f"num_shards set to {value}", False
    if change == "endianness":
        value = rng.choice([1, 2, 2**64 - 1])
        return set_field(fields, 2, VARINT, value), f"endianness set to {value}", False
    if change == "version":
        return set_field(fields, 3, BYTES, rng.randbytes(rng.choice([0, 3, 9]))), "version junk", False
    if change == "unknown field":
        return fields + [(rng.randrange(4, 40), VARINT, 7)], "unknown header field added", True
    i = rng.randrange(len(fields))
    if change == "drop":
        return fields[:i] + fields[i + 1 :], f"header field {fields[i][0]} dropped", False
    return fields[:i] + [retyped(fields[i], rng)] + fields[i + 1 :], f"header field {fields[i][0]} retyped", False


def index_records(target):  # -> a fresh list of the undamaged index's (key, value) records
    return list(target.records)


def tf_record_edit(rng, target, context):  # one message of the index changed, the table rebuilt with valid CRCs
    records = index_records(target)
    i = rng.randrange(len(records))
    key, value = records[i]
    if rng.random() < 0.3:
        value, description = mutate_bytes(rng, value)
        must_load = False
    elif key == b"":
        fields, description, must_load = edit_header(rng, fields_of(value))
        value = proto(fields)
    else:
        offsets = [fields_of_value(v).get(4, 0) for k, v in records if k]
        fields, description, must_load = edit_entry(rng, fields_of(value), offsets)
        value = proto(fields)
    records[i] = (key, value)
    return table(records), f"record {key.decode(errors='replace')!r}: {description}", must_load


def tf_key_edit(rng, target, context):  # a record renamed, repeated, dropped or moved, the table rebuilt
    records = index_records(target)
    i = rng.randrange(len(records))
    key, value = records[i]
    change = rng.choice(["rename", "repeat", "drop", "swap", "non-UTF-8", "long"])
    if change == "drop" and key and not target.fixture.checks_names:
        change = "repeat"  # a bundle with a tensor fewer is valid: only load_params can tell one is missing
    if change == "rename":
        records[i] = (mutate_bytes(rng, key, (0, len(key)) if key else None)[0], value)
    elif change == "repeat":
        records.insert(i, (key, value))
    elif change == "drop":
        records.pop(i)
    elif change == "swap" and i + 1 < len(records):
        records[i], records[i + 1] = records[i + 1], records[i]
    elif change == "non-UTF-8":
        records[i] = (key + b"\xff", value)
    elif change == "long":
        records[i] = (key + b"x" * rng.choice([300, 70_000]), value)
    return table(records), f"key {key.decode(errors='replace')!r}: {change}", False


def tf_block_edit(rng, target, context):  # bytes inside one block changed, its CRC made to match
    kind = rng.choice(["data", "data", "index", "meta"])
    change = rng.choice(["bytes", "restart count", "record header"])
    done = []

    def edit(block_kind, contents):
        if block_kind != kind or done:
            return contents
        done.append(True)
        if change == "restart count":
            count = rng.choice(awkward_integers(contents))
            return contents[:-4] + (count % 2**32).to_bytes(4, "little")
        if change == "record header":  # a record's shared, unshared or value length set to an awkward value
            pos = record_starts(contents)[0] if rng.random() < 0.5 else rng.choice(record_starts(contents))
            for _ in range(rng.randrange(3)):
                pos = read_varint(contents, pos)[1]
            old_end = read_varint(contents, pos)[1]
            return contents[:pos] + varint(rng.choice(awkward_integers(contents))) + contents[old_end:]
        return mutate_bytes(rng, contents)[0]

    return table(index_records(target), edit_block=edit), f"{kind} block: {change}", False


def record_starts(contents):  # -> offsets of each record in block contents (an empty block: [0])
    n_restarts = int.from_bytes(contents[-4:], "little")
    end, pos, starts = len(contents) - 4 * (n_restarts + 1), 0, []
    while pos < end:
        starts.append(pos)
        _, pos = read_varint(contents, pos)
        unshared, pos = read_varint(contents, pos)
        value_size, pos = read_varint(contents, pos)
        pos += unshared + value_size
    return starts or [0]


def tf_relayout(rng, target, context):  # the same records in other valid block sizes and restart intervals
    block_size, restart = rng.choice([1, 64, 300, 4096]), rng.choice([1, 2, 3, 5, 1000])
    return (table(index_records(target), block_size=block_size, restart_interval=restart),
            f"rewritten with block size {block_size}, restart interval {restart}", True)


def tf_footer(rng, target, context):  # a block handle in the footer set to an awkward offset or size
    footer = target.data[-48:]
    meta, pos = read_handle(footer, 0)
    index, _ = read_handle(footer, pos)
    handles = [list(meta), list(index)]
    which, part = rng.randrange(2), rng.randrange(2)
    handles[which][part] = rng.choice(awkward_integers(target.data) + [handles[which][part] + 1])
    rebuilt = table(index_records(target), footer=tuple(tuple(handle) for handle in handles))
    return rebuilt, f"footer {['metaindex', 'index'][which]} handle {['offset', 'size'][part]} changed", False


def tf_compression(rng, target, context):
    kind = rng.choice([1, 2, 0xFF])
    return table(index_records(target), compression=kind), f"blocks marked compressed (type {kind})", False


def raw_bytes(rng, target, context):  # any byte mutation, checksums left as they were
    return (*mutate_bytes(rng, target.data), False)


# --- The checkpoint state file: the prefix it names ---


def state_prefix(rng, target, context):
    folder, outside = context["folder"], context["outside"]
    valid = ["./model.ckpt", f"{folder}/model.ckpt", "model.ckpt"]
    invalid = [f"{outside}/model.ckpt", f"../../outside/{folder.name}/model.ckpt", "..", ".", "/", "model\0.ckpt",
               "model\n.ckpt", "x" * 5000, "model.ckpt/", "model.ckpt.index", "sub/model.ckpt", "/dev/zero", "\\"]
    prefix = rng.choice(valid + invalid)
    layout = rng.choice(['model_checkpoint_path: "{}"\n', 'model_checkpoint_path:"{}"', 'x: 1\r\nmodel_checkpoint_path:'
                         ' "{}"\r\nall_model_checkpoint_paths: "model.ckpt"\r\n'])
    return layout.format(prefix).encode(errors="surrogatepass"), f"prefix {prefix[:60]!r}", prefix in valid


# --- Targets: each damageable file, its mutations (weighted), and the boundaries truncations stop at ---


@dataclass
class Target:
    fixture: Fixture
    name: str
    data: bytes
    mutations: list  # [(weight, mutation)]: mutation(rng, target, context) -> (data, description, must load)
    boundaries: list  # byte offsets where a structure starts or ends
    records: tuple = ()  # of an index: its (key, value) records, parsed once


def tf_index_boundaries(data):  # -> offsets of each block, trailer, record, restart array and footer field
    footer_start = len(data) - 48
    bounds, pos = [footer_start, len(data) - 8], footer_start
    handles = []
    for _ in range(2):
        handle, pos = read_handle(data, pos)
        handles.append(handle)
        bounds.append(pos)
    index_block = data[handles[1][0] : sum(handles[1])]
    handles += [read_handle(value, 0)[0] for value in block_values(index_block)]
    for offset, size in handles:
        contents = data[offset : offset + size]
        n_restarts = int.from_bytes(contents[-4:], "little")
        bounds += [offset, offset + size, offset + size + 1, offset + size + 5,
                   offset + size - 4 * (n_restarts + 1), *(offset + start for start in record_starts(contents))]
    return bounds


def block_values(contents):  # -> the values of a block's records
    values = []
    for start in record_starts(contents):
        pos = read_varint(contents, start)[1]
        unshared, pos = read_varint(contents, pos)
        value_size, pos = read_varint(contents, pos)
        values.append(contents[pos + unshared : pos + unshared + value_size])
    return values


def safetensors_boundaries(data):  # -> the size field, each top-level key and separator, each tensor's span
    size, text = header_of(data)
    bounds = list(range(9)) + [8 + size - 1, 8 + size]
    header = json.loads(text)
    for name, spec in header.items():
        start = text.find(json.dumps(name).encode())
        bounds += [8 + start, 8 + start + len(json.dumps(name))]
        if name != "__metadata__":
            bounds += [8 + size + offset for offset in spec["data_offsets"]]
    return bounds


def targets():  # -> {format: [Target]}
    result = {}
    for fmt, names in FORMATS.items():
        result[fmt] = []
        for name in names:
            fixture = FIXTURES_BY_NAME[name]
            files = original_files(fixture)
            for file in fixture.files:
                data = files[file]
                if file == INDEX:
                    mutations = [(3, tf_record_edit), (1, tf_key_edit), (2, tf_block_edit), (1, tf_relayout),
                                 (1, tf_footer), (0.3, tf_compression), (2, raw_bytes)]
                    boundaries = tf_index_boundaries(data)
                elif file == DATA:
                    mutations = [(1, raw_bytes)]
                    boundaries = [0] + [b for entry in read_index(fixture.source / INDEX)[1].values()
                                        for b in (entry.offset, entry.offset + entry.size)]
                elif file == STATE:
                    mutations, boundaries = [(1, raw_bytes), (1, state_prefix)], list(range(len(data)))
                else:
                    mutations = [(3, st_bytes), (1, st_size_field), (2, st_header_text), (4, st_header_edit),
                                 (1, st_reencode)]
                    boundaries = safetensors_boundaries(data)
                cuts = sorted({cut for b in boundaries for cut in (b - 1, b) if 0 <= cut < len(data)})
                records = tuple(table_records(data)) if file == INDEX else ()
                result[fmt].append(Target(fixture, file, data, mutations, cuts, records))
    return result


# --- Cases, and the runner that loads each and judges the outcome ---

# how often each file is damaged, relative to a safetensors file's 1; tf_half's data, 12 bytes behind a DT_HALF
# entry that is refused before any data is read, has little to show
FILE_WEIGHTS = {("tf_tiny", INDEX): 5, ("tf_tiny", DATA): 2, ("tf_tiny", STATE): 1, ("tf_half", INDEX): 2,
                ("tf_half", DATA): 0.2, ("tf_half", STATE): 0.5}


@dataclass
class Case:
    number: int
    target: Target
    mutation: str  # the mutation's function name, or "cut"
    data: bytes
    description: str
    must_load: bool  # a valid re-encoding of the same tensors
    verify: bool


def cases(fmt, n_cases, runner, seed=0):  # -> iterator of Case: a cut at each structural boundary, then random ones
    format_targets = runner.targets[fmt]
    cuts = [(target, cut) for target in format_targets for cut in target.boundaries]
    weights = [FILE_WEIGHTS.get((target.fixture.name, target.name), 1) for target in format_targets]
    for number in range(n_cases):
        rng = random.Random(f"{fmt}/{seed}/{number}")
        verify = rng.random() < 0.5
        if number < len(cuts):
            target, cut = cuts[number]
            mutation, (data, description, must_load) = "cut", (target.data[:cut], f"cut at boundary {cut}", False)
        else:
            target = rng.choices(format_targets, weights)[0]
            mutation_weights, mutations = zip(*target.mutations)
            mutate = rng.choices(mutations, mutation_weights)[0]
            mutation = mutate.__name__
            data, description, must_load = mutate(rng, target, runner.context(target.fixture))
        yield Case(number, target, mutation, data, description, must_load, verify)


def replace(path, data):  # -> None; path holds data in a new file: a mapping of the old one stays valid (no SIGBUS)
    path.unlink()  # rather than os.replace, which ext4 makes flush the new file to disk: 3 ms a case
    path.write_bytes(data)


def same_arrays(actual, expected, by_name):  # -> None, or how {key: array} differs from {key: [arrays allowed]}
    if not by_name:  # only the reader ran: a tensor's name is free-form, and a renamed one is just as valid
        unmatched = list(expected.values())
        for array in actual.values():
            match = next((i for i, allowed in enumerate(unmatched) if any(map(partial(same, array), allowed))), None)
            if match is None:
                return "loaded other tensors"
            unmatched.pop(match)
        return "loaded too few tensors" if unmatched else None
    if actual.keys() != expected.keys():
        return f"loaded the tensors {sorted(map(str, actual.keys() ^ expected.keys()))[:2]} in or out of place"
    for key, allowed in expected.items():
        if not any(same(actual[key], array) for array in allowed):
            return f"loaded tensor {key} with other values or shape"
    return None


def same(a, b):  # -> True for arrays equal to the bit (NaNs too), with one dtype and shape
    return (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes())


class Runner:
    """Scratch copies of every fixture (and, beside them, copies with other data for prefixes that lead out of the
    folder); run(case) damages one file, loads, restores the file and returns None or what went wrong."""

    def __init__(self, workdir):
        self.workdir = Path(workdir).resolve()
        self.targets = targets()
        self.files = {fixture.name: original_files(fixture) for fixture in FIXTURE_LIST}
        self.layouts = {fixture.name: tensor_layout(fixture, self.files[fixture.name]) for fixture in FIXTURE_LIST}
        for fixture in FIXTURE_LIST:
            files = self.files[fixture.name]
            write_folder(self.folder(fixture), files)
            outside = dict(files)
            if DATA in files:  # other weights: a prefix leading out of the folder would load them
                outside[DATA] = flipped(files[DATA])
            write_folder(self.outside(fixture), outside)
        self.originals = {}

    def folder(self, fixture):
        return self.workdir / "cases" / fixture.name

    def outside(self, fixture):
        return self.workdir / "outside" / fixture.name

    def context(self, fixture):  # -> what mutations may refer to: the case folder, and another checkpoint outside it
        return {"folder": self.folder(fixture), "outside": self.outside(fixture)}

    def __enter__(self):
        tracemalloc.start()
        for fixture in FIXTURE_LIST:  # also warms the CRC32C tables, so no case pays for them
            for verify in (False, True):
                kind, value = self.load(fixture, verify)[0]
                self.originals[fixture.name, verify] = (kind, {key: np.array(a) for key, a in value.items()}
                                                         if kind == "arrays" else value)
        return self

    def __exit__(self, *exc_info):
        tracemalloc.stop()

    def load(self, fixture, verify):  # -> ((kind, arrays or message), seconds, peak bytes allocated)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        start = time.perf_counter()
        try:
            outcome = ("arrays", fixture.load(self.folder(fixture), verify))
        except CheckpointError as error:
            outcome = ("error", str(error))
        except Exception as error:  # anything else is a finding: say what and where
            where = traceback.extract_tb(error.__traceback__)[-1]
            outcome = ("crash", f"{type(error).__name__}: {str(error)[:200]} at {Path(where.filename).name}:"
                                f"{where.lineno}")
        seconds = time.perf_counter() - start
        return outcome, seconds, tracemalloc.get_traced_memory()[1] - before

    def run(self, case):  # -> (outcome: "arrays", "error" or "crash"; None, or a line saying what went wrong)
        fixture, name = case.target.fixture, case.target.name
        path = self.folder(fixture) / name
        replace(path, case.data)
        try:
            (kind, value), seconds, peak = self.load(fixture, case.verify)
            problem = self.judge(case, kind, value, seconds, peak)
        finally:
            replace(path, self.files[fixture.name][name])
        if problem:
            problem = f"case {case.number}: {fixture.name}/{name} {case.description} (verify={case.verify}): {problem}"
        return kind, problem

    def judge(self, case, kind, value, seconds, peak):  # -> None, or what is wrong with the outcome
        fixture = case.target.fixture
        files_size = sum(map(len, self.files[fixture.name].values())) - len(case.target.data) + len(case.data)
        budget = MEMORY_FACTOR * files_size + MEMORY_SLACK
        if kind == "crash":
            return f"raised {value}"
        if seconds > SECONDS_LIMIT:
            return f"took {seconds:.2f} s"
        if peak > budget:
            return f"allocated {peak:,} bytes, over {budget:,}"
        if kind == "arrays":
            expected = self.expected_arrays(case)
            if expected is None:
                return "loaded, but these files cannot load"
            return same_arrays(value, expected, fixture.checks_names)
        if not value.isprintable():  # the command line prints it as one "error:" line
            return f"CheckpointError message is not one printable line: {value!r:.300}"
        if value == self.originals[fixture.name, case.verify][1]:
            return None  # the undamaged fixture fails the same way (tf_half: DT_HALF)
        if case.must_load:
            return f"refused a valid file: {value}"
        blamed = [case.target.name] + [DATA] * (case.target.name == INDEX)  # an index describes its data file
        if any(str(self.folder(fixture) / name) in value for name in blamed):
            return None
        return f"CheckpointError names no damaged file: {value[:300]}"

    def expected_arrays(self, case):  # -> {key: array} the damaged files must load to, or None if they cannot
        fixture = case.target.fixture
        kind, original = self.originals[fixture.name, case.verify]
        if kind != "arrays":
            return None
        if case.target.name == fixture.payload and not (fixture.checksummed and case.verify):
            return payload_arrays(fixture, self.layouts[fixture.name], case.data)  # tensor bytes no checksum covers
        return {key: [array] for key, array in original.items()}


def write_folder(folder, files):  # -> None; folder holds exactly files ({name: bytes})
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def flipped(data):  # -> data with its middle byte inverted: inside a tensor, so it loads as other weights
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
