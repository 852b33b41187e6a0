"""Mutations of a TF checkpoint: its index's records, keys, blocks and footer, rebuilt with valid CRCs or not, and
the prefix its state file names."""
from gpt2_numpy.formats.tf_bundle import read_handle, read_varint
from scripts.common.fuzzing.mutations import awkward_integers, mutate_bytes
from scripts.common.fuzzing.tf_index import (BYTES, FIXED32, FIXED64, VARINT, fields_of, fields_of_value, proto,
                                             set_field, table, varint)


# --- TF index: records and messages changed, then written as a table with valid CRCs; or raw bytes ---

DTYPE_CODES = [0, *range(2, 25), 101, 119, 2**31, 2**64 - 1]  # every TF dtype but DT_FLOAT (1), refs, absurd ones


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
