"""CRC32C (Castagnoli), as TensorFlow and LevelDB store it, in pure NumPy at hundreds of MB/s.

A byte-at-a-time loop in Python manages ~5 MB/s. CRC is linear over GF(2), which gives two tricks:
- split the data into rows of ROW bytes: each row's CRC (from a zero register) is the XOR of one 16-bit-table lookup
  per 2-byte column, so a whole block is processed with ROW/2 vectorized lookups;
- CRC(a || b) = shift(CRC(a), len(b)) ^ CRC(b), where shift (appending zero bytes) is a 32x32 bit matrix: rows are
  combined pairwise in a tree, and blocks are chained with matrix powers.
Operators are stored as the images of the 32 bit vectors ("columns" of the matrix).
"""
from functools import lru_cache

import numpy as np

POLY = 0x82F63B78  # Castagnoli polynomial, bit-reflected
ROW = 16  # bytes per row: 8 lookup tables of 256 KB, which stay in cache
BLOCK = 1 << 21  # bytes per vectorized step: amortizes the per-call cost of NumPy, and the tree stays small
MASK_DELTA = 0xA282EAD8
BITS = np.arange(32, dtype=np.uint32)


def crc32c(data, crc=0):  # bytes-like -> int; crc continues an earlier result, as in crc32c(b, crc32c(a))
    data = np.frombuffer(data, dtype=np.uint8)
    register = shift(crc ^ 0xFFFFFFFF, len(data)) ^ raw_crc(data)  # linearity: initial value and data add up
    return register ^ 0xFFFFFFFF


def masked_crc32c(data):  # -> int, the form TF and LevelDB store, so CRCs of data that embeds CRCs stay useful
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def raw_crc(data):  # uint8 [n] -> int: the CRC register after feeding data to a zero register
    head = len(data) % BLOCK  # the odd-sized part goes first, so every later block has the same shift
    register = block_crc(np.concatenate([np.zeros(-head % ROW, np.uint8), data[:head]]))  # leading zeros are free
    for start in range(head, len(data), BLOCK):
        register = shift(register, BLOCK) ^ block_crc(data[start : start + BLOCK])
    return register


def block_crc(block):  # uint8 [n_rows * ROW] -> int
    rows = block.view("<u2").reshape(-1, ROW // 2)
    crcs = np.zeros(len(rows), np.uint32)
    looked_up = np.empty_like(crcs)
    for column, table in enumerate(row_tables()):
        crcs ^= np.take(table, rows[:, column], out=looked_up, mode="clip")  # clip: indices are in range, skip checks
    return combine_tree(crcs)


def combine_tree(crcs):  # uint32 [n] CRCs of consecutive ROW-byte rows -> int CRC of them all
    level = 0
    while len(crcs) > 1:
        if len(crcs) % 2:
            crcs = np.concatenate([np.zeros(1, np.uint32), crcs])  # a leading zero row changes nothing
        pairs = crcs.reshape(-1, 2)
        crcs = apply_tables(shift_tables(ROW << level), np.ascontiguousarray(pairs[:, 0])) ^ pairs[:, 1]
        level += 1
    return int(crcs[0]) if len(crcs) else 0


def apply_tables(tables, values):  # [4, 256] byte tables of an operator, uint32 [n] -> uint32 [n]
    value_bytes = values.astype("<u4", copy=False).view(np.uint8).reshape(-1, 4)  # byte i of each value, no shifting
    result = np.take(tables[0], value_bytes[:, 0])
    for i in range(1, 4):
        result ^= np.take(tables[i], value_bytes[:, i])
    return result


def shift(register, n_bytes):  # int -> int: the register after n_bytes zero bytes, via the binary powers of one step
    power = 0
    while n_bytes:
        if n_bytes & 1:
            register = apply_int(zero_byte_power(power), register)
        n_bytes >>= 1
        power += 1
    return register


def apply_int(images, value):  # GF(2) matrix (32 images) times one 32-bit value
    result = 0
    for image in images:
        if value & 1:
            result ^= image
        value >>= 1
    return result


def apply_matrix(images, values):  # GF(2) matrix (uint32 [32] images) times each of uint32 [...] values
    result = np.zeros_like(values)
    for bit, image in enumerate(images):  # bit by bit: no [..., 32] temporary (8 MB for the 65536-entry tables)
        result ^= ((values >> np.uint32(bit)) & np.uint32(1)) * image
    return result


@lru_cache(maxsize=None)
def zero_byte_power(power):  # -> tuple of 32 ints: the operator "feed 2**power zero bytes"
    if power == 0:
        basis = np.uint32(1) << BITS
        # one zero byte: eight shift-right steps, XORing the polynomial whenever a 1 falls off
        for _ in range(8):
            basis = np.where(basis & 1, (basis >> 1) ^ np.uint32(POLY), basis >> 1).astype(np.uint32)
        return tuple(int(image) for image in basis)
    half = np.array(zero_byte_power(power - 1), np.uint32)
    return tuple(int(image) for image in apply_matrix(half, half))  # squaring: apply the operator to its own images


def operator(n_bytes):  # -> uint32 [32]: the operator "feed n_bytes zero bytes"
    return np.array([shift(1 << bit, n_bytes) for bit in range(32)], np.uint32)


@lru_cache(maxsize=None)
def shift_tables(n_bytes):  # -> uint32 [4, 256]: byte tables applying the n_bytes shift to many values at once
    byte_values = np.arange(256, dtype=np.uint32) << (8 * np.arange(4, dtype=np.uint32))[:, None]  # [4, 256]
    return apply_matrix(operator(n_bytes), byte_values)


@lru_cache(maxsize=None)
def row_tables():  # -> ROW/2 tables of uint32 [65536]: contribution of each 2-byte column to its row's CRC
    # a register holding the two bytes, then fed the zero bytes that follow them in the row (the two themselves too:
    # feeding bytes to a zero register equals XORing them into it and feeding zeros)
    words = np.arange(1 << 16, dtype=np.uint32)
    return [apply_matrix(operator(ROW - 2 * column), words) for column in range(ROW // 2)]
