"""Mutations of any file's bytes, and of a safetensors file's size field and JSON header."""
import json
import math

from scripts.common.fuzzing.fixtures import header_of
from scripts.common.fuzzing.tf_index import varint


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


# --- safetensors: the size field, the JSON header as text and as structure ---


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
