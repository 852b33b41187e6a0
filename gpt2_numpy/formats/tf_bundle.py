"""TensorFlow V2 tensor bundles, the format of OpenAI's GPT-2 checkpoint, read without TensorFlow.

A bundle is `<prefix>.index`, a LevelDB-format sorted table mapping each tensor name to a BundleEntryProto (dtype,
shape, which data shard, byte offset and size, masked CRC32C), plus `<prefix>.data-NNNNN-of-NNNNN` holding the raw
little-endian tensor bytes. The empty key holds the BundleHeaderProto. Sources: leveldb doc/table_format.md and
TensorFlow's core/protobuf/tensor_bundle.proto; the protobuf wire format is decoded by hand.
"""
import math
from dataclasses import dataclass

import numpy as np

from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import corrupt, map_file, read_file
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
        data_paths = [f"{prefix}.data-{shard:05d}-of-{n_shards:05d}" for shard in range(n_shards)]
        self.shards = [(path, map_file(path)) for path in data_paths]

    def read(self, name, verify=False):  # -> float32 array of the entry's shape, a view of the mapped data
        entry = self.entries[name]
        check_entry(self.index_path, name, entry)
        path, data = self.shards[entry.shard_id]
        end = entry.offset + entry.size
        if end > len(data):
            raise corrupt(path, f"tensor {name} needs bytes {entry.offset:,} to {end:,} but the file ends at byte "
                          f"{len(data):,} (truncated, e.g. by an interrupted download)")
        raw = np.frombuffer(data, np.uint8, entry.size, entry.offset)
        if verify and masked_crc32c(raw) != entry.crc32c:
            raise corrupt(path, f"tensor {name} fails its CRC32C check (the data is corrupt)")
        return raw.view("<f4").reshape(entry.shape)


def check_entry(index_path, name, entry):  # the entry must describe float32 data of its shape
    if entry.dtype != DT_FLOAT:
        dtype = DTYPE_NAMES[entry.dtype] if entry.dtype < len(DTYPE_NAMES) else f"number {entry.dtype}"
        raise CheckpointError(f"{index_path}: tensor {name} has dtype {dtype}, but only DT_FLOAT (float32) "
                              "checkpoints can be loaded; convert the checkpoint to float32")
    if entry.size != 4 * math.prod(entry.shape):
        raise corrupt(index_path, f"tensor {name} has {entry.size:,} bytes but float32 of shape {list(entry.shape)} "
                      f"needs {4 * math.prod(entry.shape):,}")


def read_index(path):  # -> (number of data shards, {tensor name: BundleEntry})
    table = read_file(path)
    try:
        records = dict(table_records(table))
        if b"" not in records:
            raise ValueError("it has no bundle header entry")
        n_shards = parse_header(records.pop(b""))
        entries = {key.decode(): parse_entry(value, n_shards) for key, value in records.items()}
    except (ValueError, UnicodeDecodeError) as error:
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
    records = []
    for _, data_handle in block_records(read_block(table, index_handle)):  # (a key >= the block's last, its handle)
        records += block_records(read_block(table, read_handle(data_handle, 0)[0]))
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


def block_records(block):  # -> [(key, value)]: each key shares a prefix with the one before it
    if len(block) < 4:
        raise ValueError("a block is too short for its restart count")
    n_restarts = int.from_bytes(block[-4:], "little")
    records_end = len(block) - 4 * (n_restarts + 1)  # the restart offsets only speed up seeks: not needed here
    if records_end < 0:
        raise ValueError("a block's restart array is larger than the block")
    records, key, pos = [], b"", 0
    while pos < records_end:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        value_size, pos = read_varint(block, pos)
        if shared > len(key) or pos + unshared + value_size > records_end:
            raise ValueError("a record runs past its block")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared + value_size
        records.append((key, block[pos - value_size : pos]))
    return records


# --- Protocol buffers, the few messages the index holds ---


def parse_header(message):  # BundleHeaderProto -> number of data shards
    fields = dict(proto_fields(message))
    if fields.get(2, 0) == BIG_ENDIAN:
        raise ValueError("its tensors are big-endian, which is not supported")
    if fields.get(1, 0) < 1:
        raise ValueError("its header names no data shards")
    return fields[1]


def parse_entry(message, n_shards):  # BundleEntryProto -> BundleEntry
    names = {1: "dtype", 3: "shard_id", 4: "offset", 5: "size", 6: "crc32c"}
    fields = {}
    for number, value in proto_fields(message):
        if number == 2:
            fields["shape"] = parse_shape(value)
        elif number == 7:
            raise ValueError("it holds a partitioned (sliced) tensor, which is not supported")
        elif number in names:
            fields[names[number]] = value
    entry = BundleEntry(**fields)
    if entry.shard_id >= n_shards:
        raise ValueError(f"an entry names data shard {entry.shard_id} of only {n_shards}")
    return entry


def parse_shape(message):  # TensorShapeProto -> tuple of dimension sizes
    dims = [dict(proto_fields(dim)).get(1, 0) for number, dim in proto_fields(message) if number == 2]
    if any(size >= 1 << 63 for size in dims):  # int64 -1 (unknown) arrives as a huge unsigned varint
        raise ValueError("a tensor shape has an unknown dimension")
    return tuple(dims)


def proto_fields(message):  # protobuf wire format -> [(field number, int or bytes)]
    fields, pos = [], 0
    while pos < len(message):
        tag, pos = read_varint(message, pos)
        wire_type = tag & 7
        if wire_type == 0:
            value, pos = read_varint(message, pos)
        elif wire_type == 2:
            size, pos = read_varint(message, pos)
            value, pos = read_bytes(message, pos, size)
        elif wire_type in (1, 5):  # fixed64, fixed32
            value, pos = read_bytes(message, pos, 8 if wire_type == 1 else 4)
            value = int.from_bytes(value, "little")
        else:
            raise ValueError(f"a protobuf field has wire type {wire_type}, which these messages never use")
        fields.append((tag >> 3, value))
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
