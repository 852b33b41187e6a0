"""Writing and reading the TF index: LevelDB tables of protobuf messages, laid out as TensorFlow's BundleWriter
lays them out, so tests and mutated indexes carry valid CRCs."""
from gpt2_numpy.formats.crc32c import masked_crc32c
from gpt2_numpy.formats.tf_bundle import TABLE_MAGIC, read_varint

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


def set_field(fields, number, wire_type, value):  # -> fields with the (first) field number replaced, or appended
    for i, (existing, *_) in enumerate(fields):
        if existing == number:
            return fields[:i] + [(number, wire_type, value)] + fields[i + 1 :]
    return fields + [(number, wire_type, value)]
