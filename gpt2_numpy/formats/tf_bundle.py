"""TensorFlow V2 tensor bundles, the format of OpenAI's GPT-2 checkpoint, read without TensorFlow.

A bundle is `<prefix>.index`, a LevelDB-format sorted table mapping each tensor name to a BundleEntryProto (dtype,
shape, which data shard, byte offset and size, masked CRC32C), plus `<prefix>.data-NNNNN-of-NNNNN` holding the raw
little-endian tensor bytes. The empty key holds the BundleHeaderProto. Sources: leveldb doc/table_format.md and
TensorFlow's core/protobuf/tensor_bundle.proto; the protobuf wire format is decoded by hand.
"""
import math
import os
from dataclasses import dataclass

import numpy as np

from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import TABLE_LIMIT, check_shape, corrupt, map_file, read_file, shown
from gpt2_numpy.formats.crc32c import masked_crc32c

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48  # metaindex and index block handles (varints, zero-padded to 40 bytes), then the magic
TRAILER_SIZE = 5  # after each block: compression type byte, then masked CRC32C of the block and that byte
NO_COMPRESSION = 0
DT_FLOAT = 1
DTYPE_NAMES = (  # TensorFlow's DataType enum, in order (types.proto)
    "DT_INVALID DT_FLOAT DT_DOUBLE DT_INT32 DT_UINT8 DT_INT16 DT_INT8 DT_STRING DT_COMPLEX64 DT_INT64 DT_BOOL DT_QINT8 "
    "DT_QUINT8 DT_QINT32 DT_BFLOAT16 DT_QINT16 DT_QUINT16 DT_UINT16 DT_COMPLEX128 DT_HALF DT_RESOURCE DT_VARIANT "
    "DT_UINT32 DT_UINT64"
).split()
BIG_ENDIAN = 1  # BundleHeaderProto.Endianness
VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5  # protobuf wire types
# the fields we read, by message: field number -> (name, wire type); other fields are skipped, as protobuf does
HEADER_FIELDS = {1: ("num_shards", VARINT), 2: ("endianness", VARINT)}
ENTRY_FIELDS = {1: ("dtype", VARINT), 2: ("shape", BYTES), 3: ("shard_id", VARINT), 4: ("offset", VARINT),
                5: ("size", VARINT), 6: ("crc32c", FIXED32), 7: ("slices", BYTES)}
SHAPE_FIELDS = {2: ("dim", BYTES), 3: ("unknown_rank", VARINT)}
DIM_FIELDS = {1: ("size", VARINT)}
# Prefix compression lets each key repeat most of the one before: a small crafted index could expand to gigabytes of
# keys. Real ones expand to about half their size; allow 16 times that, plus room for short files.
KEY_BYTES_PER_INDEX_BYTE, KEY_BYTES_SLACK = 16, 2**20


@dataclass(frozen=True)
class BundleEntry:
    dtype: int = 0
    shape: tuple = ()
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int = 0  # masked


class TensorBundle:
    """The tensors of one checkpoint prefix, e.g. "models/124M/model.ckpt"; data shards are memory-mapped."""

    def __init__(self, prefix):
        self.index_path = f"{prefix}.index"
        n_shards, self.entries = read_index(self.index_path)
        check_disjoint(self.index_path, self.entries)
        # only the shards that hold tensors are opened: a damaged shard count cannot make us list or open millions
        used = sorted({entry.shard_id for entry in self.entries.values()})
        self.shards = {shard: self.open_shard(f"{prefix}.data-{shard:05d}-of-{n_shards:05d}", n_shards)
                       for shard in used}

    def open_shard(self, path, n_shards):  # -> (path, mapped data)
        if n_shards > 1 and not os.path.lexists(path):  # the index's shard count made the name: blame it too
            raise CheckpointError(f"{path} is missing ({self.index_path} lists {n_shards:,} data shards); download "
                                  "the model again", files=(self.index_path,))
        return path, map_file(path)

    def read(self, name, verify=False):  # -> float32 array of the entry's shape, a view of the mapped data
        entry = self.entries[name]
        check_entry(self.index_path, name, entry)
        path, data = self.shards[entry.shard_id]
        end = entry.offset + entry.size
        if end > len(data):
            raise corrupt(path, f"tensor {shown(name)} needs bytes {entry.offset:,} to {end:,} but the file ends at "
                          f"byte {len(data):,} (truncated, e.g. by an interrupted download)", self.index_path)
        raw = np.frombuffer(data, np.uint8, entry.size, entry.offset)
        if verify and masked_crc32c(raw) != entry.crc32c:
            raise corrupt(path, f"tensor {shown(name)} fails its CRC32C check (the data is corrupt)", self.index_path)
        return raw.view("<f4").reshape(entry.shape)


def check_entry(index_path, name, entry):  # the entry must describe float32 data of its shape
    if entry.dtype != DT_FLOAT:
        dtype = DTYPE_NAMES[entry.dtype] if entry.dtype < len(DTYPE_NAMES) else f"number {entry.dtype}"
        raise CheckpointError(f"{index_path}: tensor {shown(name)} has dtype {dtype}, but only DT_FLOAT (float32) "
                              "checkpoints can be loaded; convert the checkpoint to float32", files=(index_path,))
    check_shape(index_path, name, entry.shape, 4)
    if entry.size != 4 * math.prod(entry.shape):
        raise corrupt(index_path, f"tensor {shown(name)} has {entry.size:,} bytes but float32 of shape "
                      f"{list(entry.shape)} needs {4 * math.prod(entry.shape):,}")


def check_disjoint(index_path, entries):  # tensors never share bytes: an entry pointing at another's is damage
    spans = sorted((entry.shard_id, entry.offset, entry.offset + entry.size, name) for name, entry in entries.items())
    for (shard, _, end, name), (next_shard, begin, _, next_name) in zip(spans, spans[1:]):
        if shard == next_shard and begin < end:
            raise corrupt(index_path, f"tensors {shown(name)} and {shown(next_name)} overlap in data shard {shard} "
                          "(the index is corrupt)")


def read_index(path):  # -> (number of data shards, {tensor name: BundleEntry})
    table = read_file(path, TABLE_LIMIT)
    try:
        records = dict(table_records(table))
        if b"" not in records:
            raise ValueError("it has no bundle header entry")
        n_shards = parse_header(records.pop(b""))
        entries = {}
        for key, value in records.items():
            name = key.decode()
            entries[name] = parse_entry(value, n_shards, name)
    except ValueError as error:  # UnicodeDecodeError is one too
        raise corrupt(path, f"not a valid TensorFlow checkpoint index: {error}") from None
    return n_shards, entries


# --- LevelDB table: footer -> index block -> data blocks -> prefix-compressed records ---


def table_records(table):  # bytes of a whole .index file -> [(key, value)] of every data block
    if len(table) < FOOTER_SIZE:
        raise ValueError(f"{len(table)} bytes is too short for a table (empty or truncated file)")
    footer = table[-FOOTER_SIZE:]
    if int.from_bytes(footer[-8:], "little") != TABLE_MAGIC:
        raise ValueError("the footer magic number is wrong (truncated file, or not a checkpoint index)")
    _, pos = read_handle(footer, 0)  # the metaindex block: TensorFlow leaves it empty
    index_handle, _ = read_handle(footer, pos)
    records, key_budget = [], KEY_BYTES_PER_INDEX_BYTE * len(table) + KEY_BYTES_SLACK
    # each index entry: (a key >= the last of its data block, the block's handle)
    for _, data_handle in block_records(read_block(table, index_handle), key_budget):
        for key, value in block_records(read_block(table, read_handle(data_handle, 0)[0]), key_budget):
            if records and key <= records[-1][0]:  # also stops an index that lists one block many times
                raise ValueError(f"its keys are not in increasing order (at {shown(key.decode(errors='replace'))})")
            key_budget -= len(key)
            records.append((key, value))
    return records


def read_handle(buffer, pos):  # -> ((offset, size), next position)
    offset, pos = read_varint(buffer, pos)
    size, pos = read_varint(buffer, pos)
    return (offset, size), pos


def read_block(table, handle):  # -> contents of the block at handle, after checking its trailer
    offset, size = handle
    end = offset + size
    if end + TRAILER_SIZE > len(table) - FOOTER_SIZE:
        raise ValueError(f"the block at byte {offset:,} runs past the end of the file (truncated?)")
    stored_crc = int.from_bytes(table[end + 1 : end + TRAILER_SIZE], "little")
    if masked_crc32c(table[offset : end + 1]) != stored_crc:  # the CRC covers the type byte too
        raise ValueError(f"the block at byte {offset:,} fails its CRC32C check (the file is corrupt)")
    if table[end] != NO_COMPRESSION:
        raise ValueError(f"the block at byte {offset:,} is compressed (type {table[end]}), which is not supported")
    return table[offset:end]


def block_records(block, key_budget):  # -> [(key, value)]: each key shares a prefix with the one before it
    if len(block) < 4:
        raise ValueError("a block is too short for its restart count")
    n_restarts = int.from_bytes(block[-4:], "little")
    records_end = len(block) - 4 * (n_restarts + 1)  # the restart offsets only speed up seeks: not needed here
    if records_end < 0:
        raise ValueError("a block's restart array is larger than the block")
    records, key, pos, key_bytes = [], b"", 0, 0
    while pos < records_end:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        value_size, pos = read_varint(block, pos)
        if shared > len(key) or pos + unshared + value_size > records_end:
            raise ValueError("a record runs past its block")
        key_bytes += shared + unshared
        if key_bytes > key_budget:
            raise ValueError(f"its keys expand to over {key_bytes:,} bytes, implausibly many for its size")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared + value_size
        records.append((key, block[pos - value_size : pos]))
    return records


# --- Protocol buffers, the few messages the index holds ---


def parse_header(message):  # BundleHeaderProto -> number of data shards
    fields = dict(known_fields(message, HEADER_FIELDS, "the bundle header"))
    if fields.get("endianness", 0) == BIG_ENDIAN:
        raise ValueError("its tensors are big-endian, which is not supported")
    if fields.get("num_shards", 0) < 1:
        raise ValueError("its header names no data shards")
    return fields["num_shards"]


def parse_entry(message, n_shards, name):  # BundleEntryProto -> BundleEntry
    fields = {}
    for field, value in known_fields(message, ENTRY_FIELDS, f"tensor {shown(name)}"):
        if field == "slices":
            raise ValueError(f"tensor {shown(name)} is partitioned (sliced), which is not supported")
        fields[field] = parse_shape(value, name) if field == "shape" else value
    entry = BundleEntry(**fields)
    if entry.shard_id >= n_shards:
        raise ValueError(f"tensor {shown(name)} names data shard {entry.shard_id} of only {n_shards}")
    return entry


def parse_shape(message, name):  # TensorShapeProto -> tuple of dimension sizes
    what = f"the shape of tensor {shown(name)}"
    fields = known_fields(message, SHAPE_FIELDS, what)
    if dict(fields).get("unknown_rank"):
        raise ValueError(f"{what} has an unknown rank")
    dims = [dict(known_fields(dim, DIM_FIELDS, what)).get("size", 0) for field, dim in fields if field == "dim"]
    if any(size >= 1 << 63 for size in dims):  # int64 -1 (unknown) arrives as a huge unsigned varint
        raise ValueError(f"{what} has an unknown or impossible dimension")
    return tuple(dims)


def known_fields(message, schema, what):  # -> [(field name, value)] of the fields schema names, in order
    fields = []
    for number, wire_type, value in proto_fields(message):
        if number in schema:
            field, expected = schema[number]
            if wire_type != expected:  # e.g. a length-delimited "dtype" would be bytes where a number belongs
                raise ValueError(f"field {number} ({field}) of {what} has wire type {wire_type}, not {expected}")
            fields.append((field, value))
    return fields


def proto_fields(message):  # protobuf wire format -> [(field number, wire type, int or bytes)]
    fields, pos = [], 0
    while pos < len(message):
        tag, pos = read_varint(message, pos)
        wire_type = tag & 7
        if wire_type == VARINT:
            value, pos = read_varint(message, pos)
        elif wire_type == BYTES:
            size, pos = read_varint(message, pos)
            value, pos = read_bytes(message, pos, size)
        elif wire_type in (FIXED64, FIXED32):
            value, pos = read_bytes(message, pos, 8 if wire_type == FIXED64 else 4)
            value = int.from_bytes(value, "little")
        else:
            raise ValueError(f"a protobuf field has wire type {wire_type}, which these messages never use")
        fields.append((tag >> 3, wire_type, value))
    return fields


def read_bytes(buffer, pos, size):  # -> (buffer[pos:pos+size], next position)
    if pos + size > len(buffer):
        raise ValueError("a field runs past the end of its message")
    return buffer[pos : pos + size], pos + size


def read_varint(buffer, pos):  # -> (value, next position): 7 bits a byte, low bits first, high bit means "more"
    value = shift = 0
    while pos < len(buffer) and shift < 64:
        byte = buffer[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos
    raise ValueError("a varint runs past the end of its buffer")
