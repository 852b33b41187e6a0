"""GPT-2's byte-level BPE tokenizer: text <-> token ids, agreeing with OpenAI's encoder.py (and tiktoken's "gpt2").

Encoding runs in three steps:
1. A regex splits the text into words (letter runs, digit runs, punctuation runs, whitespace, English contractions).
2. Each of the word's UTF-8 bytes starts as its own part (the vocabulary files, read by formats/vocabulary.py, spell
   the 256 bytes with printable stand-in characters; the tokenizer maps tokens to bytes once, when it loads).
3. BPE merges adjacent parts of the word, best-ranked merge first, until no merge applies; each part is one token.
   `Tokenizer.textbook_bpe` is that loop as written in tiktoken's _educational.py and minbpe, to read first;
   `Tokenizer._bpe`, which encode uses, gives the same ids in work that grows linearly with a word's length, so even a
   word of a megabyte (minified code, a run of digits) takes no longer than its length demands.

Decoding maps ids back to bytes; bytes that end mid-way through a UTF-8 character become U+FFFD, and `stream_decoder()`
holds such bytes back until the character is complete. `token_text` shows one token alone, where a piece of a
character is its bytes written \xe2.
"""
import codecs
import heapq
import math
import operator
from collections import defaultdict
from itertools import chain
from pathlib import Path

import numpy as np
import regex

from gpt2_numpy.errors import OutOfVocabulary
from gpt2_numpy.formats.vocabulary import EOT, bytes_to_unicode, read_vocabulary

EOT_ID = 50256
# OpenAI's split: contractions, then runs of letters / digits / other symbols each with at most one leading space,
# then whitespace; `\s+(?!\S)` leaves a run's last space to start the next word, so " world" stays one token.
WORD_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
# OpenAI's encoder.json and vocab.bpe (MIT-licensed, 1.5 MB), shipped so the tokenizer works without a model folder
PACKAGED_VOCABULARY = Path(__file__).resolve().parent / "data"
CACHE_SIZE = 100_000  # words remembered between calls; most words of a text repeat, a few are new
CACHED_WORD_CHARS = 64  # longer words are not remembered: rarely seen twice, and a 1 MB one would hold ~20 MB of ids


class Tokenizer:
    """GPT-2's tokenizer; build it with `load_tokenizer(model_dir)`.

    `encode` treats the text "<|endoftext|>" as ordinary text by default, like OpenAI's encoder.py and tiktoken's
    `encode_ordinary`: text from users cannot inject the end-of-text token by accident. Pass
    `allowed_special={"<|endoftext|>"}` (or "all") to map it to its id, `eot_id`: 50256 in GPT-2's vocabulary, the
    last id in one trained by gpt2_numpy.tokenizer_train.
    """

    def __init__(self, encoder, merges):  # encoder: {spelled token: id}, merges: [(left, right)], best first
        self.encoder = encoder
        self.n_vocab = len(encoder)
        self.eot_id = encoder[EOT]
        self.special_tokens = {EOT: self.eot_id}
        # tokens as the bytes they stand for: each spelled character is one byte, as Latin-1
        unspell = str.maketrans({char: chr(byte) for byte, char in bytes_to_unicode().items()})
        self._id_bytes = [b""] * self.n_vocab
        for token, token_id in encoder.items():
            self._id_bytes[token_id] = token.translate(unspell).encode("latin-1")
        self._word_ids = {token_bytes: token_id for token_id, token_bytes in enumerate(self._id_bytes)}  # bytes -> id
        self._byte_ids = [self._word_ids[bytes([byte])] for byte in range(256)]
        self.merge_ranks = {(encoder[left], encoder[right]): rank for rank, (left, right) in enumerate(merges)}
        # the tuned BPE's pair (left, right) is the int left * n_vocab + right, cheaper to hash than a tuple
        self._pair_ranks = {encoder[left] * self.n_vocab + encoder[right]: rank
                            for rank, (left, right) in enumerate(merges)}
        self._merged_ids = [encoder[left + right] for left, right in merges]  # rank -> id of the joined token
        self._cache = WordCache(self._encode_word)

    def textbook_bpe(self, utf8):  # b"hello" -> [31373]: join the best-ranked adjacent pair until none merges
        ids = [self._byte_ids[byte] for byte in utf8]  # one part per byte to start
        while len(ids) >= 2:
            # the adjacent pair whose merge comes first in the merges list; pairs with no merge come last
            best = min(zip(ids, ids[1:]), key=lambda pair: self.merge_ranks.get(pair, math.inf))
            if best not in self.merge_ranks:
                break  # no adjacent pair has a merge
            ids = replace_pair(ids, best, self._merged_ids[self.merge_ranks[best]])
        return ids

    def encode(self, text, allowed_special=()):  # -> list of ids
        """GPT-2's ids for text. Special tokens such as <|endoftext|> are plain text unless named in allowed_special
        (a set, or "all"; None: none); lone surrogates become U+FFFD, as in tiktoken."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}; decode bytes to str first")
        text = without_surrogates(text)
        specials = self._allowed_specials(allowed_special)
        if not specials:
            return self._encode_ordinary(text)
        # the capturing group keeps each special token in the split, at the odd positions
        chunks = regex.split("(" + "|".join(map(regex.escape, specials)) + ")", text)
        ids = []
        for position, chunk in enumerate(chunks):
            ids += [self.special_tokens[chunk]] if position % 2 else self._encode_ordinary(chunk)
        return ids

    def decode(self, ids):  # -> str
        """The text of ids; bytes that do not form whole UTF-8 characters become U+FFFD."""
        return b"".join(map(self.token_bytes, ids)).decode("utf-8", errors="replace")

    def stream_decoder(self):  # -> StreamDecoder
        """A decoder for streaming: add(id) returns only completed characters, finish() the rest."""
        return StreamDecoder(self)

    def token_bytes(self, token_id):  # -> the bytes one id stands for
        index = operator.index(token_id)  # ints and NumPy integers pass, floats raise TypeError
        if not 0 <= index < self.n_vocab:
            raise ValueError(f"token id {index} is outside the vocabulary: ids run from 0 to {self.n_vocab - 1}")
        return self._id_bytes[index]

    def token_text(self, token_id):  # -> one token's text; a piece of a character shows its bytes as \xe2
        return self.token_bytes(token_id).decode("utf-8", errors="backslashreplace")

    def _allowed_specials(self, allowed_special):  # -> special tokens to map to their ids, longest first
        if allowed_special == "all":
            return sorted(self.special_tokens, key=len, reverse=True)
        if allowed_special is None:
            return []
        if isinstance(allowed_special, str):
            raise ValueError(f"allowed_special={allowed_special!r}: pass a set such as {{{EOT!r}}}, or 'all'")
        unknown = set(allowed_special) - set(self.special_tokens)
        if unknown:
            known = [*self.special_tokens]
            raise ValueError(f"allowed_special has unknown special tokens {sorted(unknown)}; known ones: {known}")
        return sorted(allowed_special, key=len, reverse=True)

    def _encode_ordinary(self, text):  # -> list of ids
        # the hot loop runs in C: most words are in the cache, and only a new one calls back into Python
        return list(chain.from_iterable(map(self._cache.__getitem__, WORD_PATTERN.findall(text))))

    def _encode_word(self, word):  # -> tuple of ids
        utf8 = word.encode("utf-8")
        # a word that is itself a token needs no merging: BPE rebuilds every GPT-2 token from its bytes (tested)
        whole = self._word_ids.get(utf8)
        return (whole,) if whole is not None else tuple(self._bpe(utf8))

    def _bpe(self, utf8):  # -> the ids of textbook_bpe, in O(1) work per merge instead of O(n)
        # The textbook rescans every pair after each merge (`best = min(zip(ids, ids[1:]), ...)`) and copies the word
        # (`replace_pair`): O(n) per merge, O(n^2) for a word of n bytes, hours for 1 MB. Here instead the parts form
        # a linked list (part i has neighbours before[i] and after[i]), each pair that has a merge waits in its rank's
        # bucket, and a heap yields the ranks present, best first (replacing the `min`). A merge changes only the two
        # pairs beside it (replacing `replace_pair`): O(1) work per merge, plus O(log n) per rank that enters the heap.
        # Invariant: pair_rank[i] is the rank of the pair (part i, part after[i]), or None if that pair has no merge
        # or i no longer starts a part; a bucket entry that disagrees is stale and skipped.
        ids = [self._byte_ids[byte] for byte in utf8]  # one part per byte to start
        n, n_vocab, merged_ids, rank_of = len(ids), self.n_vocab, self._merged_ids, self._pair_ranks.get
        pair_rank = [rank_of(left * n_vocab + right) for left, right in zip(ids, ids[1:])] + [None]
        # one int object per position, shared by before, after and the buckets (not one per list, from range and
        # enumerate): less memory per byte of the word, so fewer cache misses once a long word outgrows the cache
        positions = list(range(n + 1))
        buckets = defaultdict(list)  # rank -> starts of the pairs that had that rank when added
        for i, rank in zip(positions, pair_rank):
            if rank is not None:
                buckets[rank].append(i)
        ranks = list(buckets)
        heapq.heapify(ranks)
        before, after = [-1, *positions[:-1]], positions[1:]  # before[n]: the end of the word has one too
        while ranks:
            rank = heapq.heappop(ranks)
            joined = merged_ids[rank]
            # left to right, as OpenAI's encoder does: "aaa" -> "aa a". No sort needed: a pair forms only when the
            # later-made of its two tokens is made, so a bucket fills at the start or during one rank's pass, which
            # goes left to right and adds positions in order
            for i in buckets.pop(rank):
                if pair_rank[i] != rank:
                    continue
                right = after[i]
                ids[i], ids[right], pair_rank[right] = joined, None, None  # the right part is used up
                after[i] = after[right]
                before[after[i]] = i
                for left in (before[i], i):  # the pairs that now end and start with the joined part
                    if left < 0:
                        continue
                    right = after[left]
                    new_rank = pair_rank[left] = rank_of(ids[left] * n_vocab + ids[right]) if right < n else None
                    if new_rank is not None:
                        if new_rank not in buckets:
                            heapq.heappush(ranks, new_rank)
                        buckets[new_rank].append(left)
        return [token_id for token_id in ids if token_id is not None]


def replace_pair(ids, pair, joined_id):  # -> ids with each (left, right) == pair replaced by joined_id
    # left to right, as OpenAI's encoder and BPE training do: (a, a) in "a a a" -> "aa a"
    replaced, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            replaced.append(joined_id)
            i += 2
        else:
            replaced.append(ids[i])
            i += 1
    return replaced


def without_surrogates(text):  # -> text, with surrogate pairs joined and lone surrogates as U+FFFD, as tiktoken does
    # UTF-8 cannot hold surrogates, yet a str from JSON ("\ud83d\ude00") or a Windows API may carry them
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class WordCache(dict):
    """word -> tuple of ids; a word not yet seen is encoded once and remembered (if it is short), up to CACHE_SIZE
    words."""

    def __init__(self, encode_word):
        super().__init__()
        self._encode_word = encode_word

    def __missing__(self, word):
        word_ids = self._encode_word(word)
        if len(word) <= CACHED_WORD_CHARS:
            if len(self) >= CACHE_SIZE:  # a rough bound on memory; the common words come back soon
                self.clear()
            self[word] = word_ids
        return word_ids


class StreamDecoder:
    """Decodes ids one at a time for streaming output: `add` returns only characters whose bytes are all there (an
    emoji split over several tokens appears once its last byte arrives); `finish` flushes the rest, with U+FFFD for
    an incomplete character. Concatenated, the pieces equal `decode` of all the ids."""

    def __init__(self, tokenizer):
        self._token_bytes = tokenizer.token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id):  # -> newly completed text, often ""
        return self._utf8.decode(self._token_bytes(token_id))

    def finish(self):  # -> whatever is held back, as U+FFFD; "" once called, so a caller cut short may call it again
        return self._utf8.decode(b"", final=True)

    def pieces(self, ids):  # -> iterator of the non-empty pieces of ids' text, each yielded before the next id is read
        """add() of each id as it comes, then finish(): an unfinished character at the end is U+FFFD. If ids raises
        (Ctrl-C while generating), the held-back bytes stay in the decoder for finish()."""
        for token_id in ids:
            if piece := self.add(token_id):
                yield piece
        if rest := self.finish():
            yield rest


def load_tokenizer(model_dir=None):  # -> Tokenizer
    """GPT-2's tokenizer from OpenAI's encoder.json + vocab.bpe or Hugging Face's vocab.json + merges.txt in model_dir,
    or, without model_dir, from the copies of OpenAI's files that come with the package; TokenizerError names a
    missing or malformed file."""
    return Tokenizer(*read_vocabulary(PACKAGED_VOCABULARY if model_dir is None else Path(model_dir)))


def check_in_vocabulary(tokenizer, ids, n_vocab, what, fix):  # -> ids; OutOfVocabulary names the first id >= n_vocab
    # a text the model cannot read: GPT-2's tokenizer makes ids up to 50256, a smaller model has no embedding for some
    position = next((index for index, token_id in enumerate(ids) if token_id >= n_vocab), None)
    if position is not None:
        token_id = ids[position]
        raise OutOfVocabulary(f"{what}'s token {token_id} ({tokenizer.decode([token_id])!r}, position {position}) is "
                         f"outside this model's vocabulary of {n_vocab} tokens: {fix}")
    return ids


def checked_ids(tokenizer, text, n_vocab, what, fix, first=()):  # -> [*first, *the text's ids], each < n_vocab
    # "<|endoftext|>" written in a text is the document separator, as in GPT-2's training data
    return check_in_vocabulary(tokenizer, [*first, *tokenizer.encode(text, allowed_special="all")], n_vocab, what, fix)


def token_windows(ids, seq_len, n_windows=None, targets=False):  # int [n] -> int [count, seq_len (+ 1)], a view
    """The windows of seq_len ids that start every seq_len ids, the first n_windows of them at most; with targets,
    each with the id after it too (its inputs' next-token targets), so that it overlaps the next window by one."""
    ids, width = np.asarray(ids), seq_len + targets
    count = max(0, (len(ids) - targets) // seq_len)
    count = count if n_windows is None else min(count, n_windows)
    if count == 0:
        return ids[:0].reshape(0, width)
    return np.lib.stride_tricks.sliding_window_view(ids[: count * seq_len + targets], width)[::seq_len]


def text_windows(tokenizer, text, n_vocab, seq_len, n_windows=None, targets=False):  # -> (ids int64 [n], windows)
    """A text's ids, each in the model's vocabulary (OutOfVocabulary otherwise), and its first windows of them
    (token_windows's); no window when the text is shorter than one."""
    ids = np.asarray(checked_ids(tokenizer, text, n_vocab, "the data", "use a text of the model's vocabulary"),
                     dtype=np.int64)
    return ids, token_windows(ids, seq_len, n_windows, targets)


if __name__ == "__main__":  # the command imports this module (every command loads through it), so it cannot run here
    import sys

    print("error: gpt2_numpy.tokenizer is the tokenizer's library; its command line is python -m gpt2_numpy tokenizer "
          "(or gpt2-numpy tokenizer)", file=sys.stderr)
    sys.exit(2)  # the status of every usage error
