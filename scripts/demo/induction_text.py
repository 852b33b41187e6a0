"""Write a text in which only content-based induction predicts anything: random sequences of random characters, each
said twice (or --copies times) with a random gap between the copies, one sequence after another.

    python -m scripts.demo.induction_text OUT.txt [--chars N] [--seed S] [--copies C]

Nothing in it is predictable from the tokens just before (the characters are drawn independently), and no fixed
distance back finds an earlier copy (the lengths and gaps vary): a model predicts a later copy only by finding where
the current token stood before and copying what followed it, which is what an induction head does. The characters are
drawn from all of Unicode's UTF-8 lengths, so that a byte-level model (train --vocab-size 257) sees nearly every byte
(all but C0, C1 and F5..FF, which UTF-8 never uses), as `explain --heads` draws its repeated probe from every id.
"""
import argparse
from pathlib import Path

import numpy as np

LENGTHS = (3, 8)  # characters in a sequence said twice (about 1.75 bytes each), at least and at most
GAPS = (0, 3)  # random characters between its two copies, at least and at most
# Unicode ranges by UTF-8 length (1, 2, 3, 4 bytes), surrogates left out, and how often each is drawn
RANGES = ((0x00, 0x80), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000))
WEIGHTS = (0.5, 0.3, 0.12, 0.03, 0.05)


def random_chars(rng, n):  # -> str of n characters drawn independently
    ranges = rng.choice(len(RANGES), n, p=WEIGHTS)
    low, high = np.array(RANGES).T
    return "".join(map(chr, rng.integers(low[ranges], high[ranges])))


def induction_text(n_chars, seed, lengths=LENGTHS, gaps=GAPS, copies=2):  # -> str of about n_chars characters:
    # R gap R (gap R, copies times in all), R' gap' R', ...
    rng = np.random.default_rng(seed)
    pieces, total = [], 0
    while total < n_chars:
        sequence = random_chars(rng, rng.integers(lengths[0], lengths[1] + 1))
        pieces.append(sequence + "".join(random_chars(rng, rng.integers(gaps[0], gaps[1] + 1)) + sequence
                                         for _ in range(copies - 1)))
        total += len(pieces[-1])
    return "".join(pieces).replace("<|endoftext|>", "")  # never drawn in practice; the tokenizer would make it one id


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the text file to write (UTF-8)")
    parser.add_argument("--chars", type=int, default=1_000_000, help="about this many characters (1,000,000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draws (0)")
    parser.add_argument("--lengths", type=int, nargs=2, default=LENGTHS, metavar=("MIN", "MAX"),
                        help="characters in a sequence said twice (%(default)s)")
    parser.add_argument("--gaps", type=int, nargs=2, default=GAPS, metavar=("MIN", "MAX"),
                        help="random characters between the copies (%(default)s)")
    parser.add_argument("--copies", type=int, default=2, help="times each sequence is said (%(default)s)")
    args = parser.parse_args()
    args.out.write_bytes(induction_text(args.chars, args.seed, args.lengths, args.gaps, args.copies).encode("utf-8"))


if __name__ == "__main__":
    main()
