"""Training a byte-level BPE vocabulary on a text, merge for merge as Hugging Face's `tokenizers` trains one.

Training runs in three steps:
1. GPT-2's regex (tokenizer.WORD_PATTERN) splits the text into words, and each distinct word is counted once; merges
   never cross a word's edge.
2. Every word starts as its UTF-8 bytes, one token each.
3. Repeat: count each adjacent pair of tokens over all the words, each word weighted by how often it occurs (a run
   "a a a" holds the pair (a, a) twice); merge the most frequent pair into a new token everywhere, left to right
   ("a a a" -> "aa a"), until the vocabulary is full.

The rule, read from Hugging Face's trainer (tokenizers/src/models/bpe/trainer.rs, `impl Ord for Merge`), which we follow
so that both give the same merges in the same order:
- the highest count wins; between equal counts, the smaller pair (left id, then right id) wins. Hugging Face's ids are
  ours + 1 (its <|endoftext|> comes first, at 0; its bytes then follow in the order of their stand-in characters,
  which is GPT-2's byte order), so comparing its ids or ours gives the same order;
- training stops when the vocabulary is full (256 bytes + merges + <|endoftext|> = vocab_size), or when the best
  pair occurs fewer than `min_frequency` times (or no pair is left): the vocabulary is then smaller than asked;
- "<|endoftext|>" in the text is ordinary text, as Hugging Face's trainer sees it.
This is the trainer of `BpeTrainer(vocab_size, min_frequency, special_tokens=["<|endoftext|>"],
initial_alphabet=ByteLevel.alphabet())` on a `ByteLevel(add_prefix_space=False, use_regex=True)` pre-tokenizer.

Ids follow GPT-2's convention: 0-255 are the bytes in GPT-2's byte order (encoder.json's first 256 entries), merge k
makes id 256 + k, and <|endoftext|> is the last id. Hugging Face's trainer gives a merge that joins into an existing
token no new id; in byte-level BPE that does not happen in practice (on none of thousands of seeded texts, nor on the
Shakespeare corpus up to 20,000 tokens), and both trainers here assume that every merge makes a new token.

`train_bpe_textbook` is step 3 as written; `train_bpe` gives the same merges in time that grows with the work each
merge does, as Hugging Face's trainer does. `save_tokenizer` writes vocab.json + merges.txt in Hugging Face's GPT-2
layout, which gpt2_numpy.tokenizer.load_tokenizer and `transformers.GPT2TokenizerFast.from_pretrained` both read.
"""
import heapq
import json
from collections import Counter, defaultdict
from pathlib import Path

from tqdm import tqdm

from gpt2_numpy.errors import UsageError
from gpt2_numpy.disk import atomic_write
from gpt2_numpy.tokenizer import EOT, WORD_PATTERN, Tokenizer, bytes_to_unicode, replace_pair, without_surrogates

BYTE_IDS = {byte: token_id for token_id, byte in enumerate(bytes_to_unicode())}  # GPT-2's byte order: "!" is 0
MERGES_HEADER = "#version: 0.2\n"  # the first line of Hugging Face's merges.txt (and of OpenAI's vocab.bpe)


def train_bpe_textbook(text, vocab_size, min_frequency=2):  # -> merges [(left id, right id)]; merge k makes 256 + k
    """The merges of a vocab_size-token vocabulary trained on text, by recounting every pair after each merge."""
    n_merges = merges_to_make(vocab_size)
    words = [(byte_ids(word), count) for word, count in word_counts(text).items()]
    merges = []
    while len(merges) < n_merges:
        pair_counts = Counter()
        for word, count in words:
            for pair in zip(word, word[1:]):
                pair_counts[pair] += count
        if not pair_counts:
            break  # every word is one token
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))  # most frequent, then the smaller pair
        if pair_counts[best] < min_frequency:
            break
        new_id = 256 + len(merges)
        words = [(replace_pair(word, best, new_id), count) for word, count in words]
        merges.append(best)
    return merges


def train_bpe(text, vocab_size, min_frequency=2, quiet=False):  # -> the merges of train_bpe_textbook
    """The merges of a vocab_size-token vocabulary trained on text; a progress bar on stderr counts them, unless
    quiet. Fewer merges than vocab_size - 257 means no pair was left that occurs min_frequency times."""
    # The textbook recounts every pair of every word after each merge (`pair_counts = Counter()`): O(text) per merge.
    # Here the counts are kept, and a merge updates only the words that hold its pair (`where`, replacing the loop
    # over all words); a heap yields the best pair (replacing `min` over all pairs). A heap entry may be stale: a pair's
    # count only falls after its first entry (it can rise only in the merge that makes one of its two tokens, which
    # pushes the entry), so an entry whose count disagrees is pushed back with the current count, as HF's trainer does.
    n_merges = merges_to_make(vocab_size)
    words, counts = [], []
    for word, count in word_counts(text).items():
        words.append(byte_ids(word))
        counts.append(count)
    pair_counts, where = defaultdict(int), defaultdict(set)  # pair -> its count; pair -> indices of words holding it
    for index, (word, count) in enumerate(zip(words, counts)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += count
            where[pair].add(index)
    heap = [(-count, *pair) for pair, count in pair_counts.items()]  # best first: highest count, then smallest pair
    heapq.heapify(heap)
    merges = []
    # no bar for no merge (--vocab-size 257): tqdm would print "BPE merges: 0merge"
    with tqdm(total=n_merges, desc="BPE merges", unit="merge", disable=quiet or not n_merges) as progress:
        while heap and len(merges) < n_merges:
            negative_count, left, right = heapq.heappop(heap)
            best, count = (left, right), pair_counts[left, right]
            if count != -negative_count:  # stale: the pair has lost occurrences to merges since this entry was pushed
                if count > 0:
                    heapq.heappush(heap, (-count, left, right))
                continue
            if count < min_frequency:
                break
            new_id = 256 + len(merges)
            merges.append(best)
            new_pairs = merge_in_words(best, new_id, where.pop(best), words, counts, pair_counts, where)
            for pair in new_pairs:
                heapq.heappush(heap, (-pair_counts[pair], *pair))
            progress.update()
    return merges


def merge_in_words(pair, new_id, indices, words, counts, pair_counts, where):  # -> pairs made with new_id
    """Merge pair into new_id in the words at indices (in place), keeping pair_counts and where up to date."""
    new_pairs = set()
    for index in indices:
        word, count = words[index], counts[index]
        merged = replace_pair(word, pair, new_id)
        if len(merged) == len(word):
            continue  # an earlier merge took the pair out of this word; `where` keeps stale indices, as HF's does
        # take the word's old pairs out and put its new ones in: pairs away from the merge cancel out
        for old in zip(word, word[1:]):
            pair_counts[old] -= count
        for new in zip(merged, merged[1:]):
            pair_counts[new] += count
            if new_id in new:
                new_pairs.add(new)
                where[new].add(index)
        words[index] = merged
    del pair_counts[pair]  # now 0: every occurrence was merged
    return new_pairs


def train_vocabulary(text, vocab_size, min_frequency=2, what="the text"):  # -> train_bpe's merges, all of them
    """train_bpe's merges; UsageError when the text cannot make the whole vocabulary (too few pairs seen at least
    min_frequency times), saying how large a vocabulary it can make."""
    merges = train_bpe(text, vocab_size, min_frequency)
    if len(merges) < merges_to_make(vocab_size):
        # at --min-frequency 1 (the lowest), every pair seen is merged already: only more text makes more
        seen, lower = (f" seen at least {min_frequency} times", " lower --min-frequency,") if min_frequency > 1 else (
            "", "")
        raise UsageError(f"--vocab-size {vocab_size}: {what} has only {len(merges):,} pairs to merge{seen}, which make "
                         f"a vocabulary of {257 + len(merges):,} tokens: ask for --vocab-size {257 + len(merges)} or "
                         f"less,{lower} or give more text")
    return merges


def merges_to_make(vocab_size):  # -> the number of merges a vocab_size-token vocabulary holds
    if vocab_size < 257:
        raise ValueError(f"vocab_size is {vocab_size}: it must be at least 257, the 256 bytes and {EOT}")
    return vocab_size - 257


def word_counts(text):  # -> Counter {word: occurrences} of GPT-2's split of text
    return Counter(WORD_PATTERN.findall(without_surrogates(text)))


def byte_ids(word):  # -> [id of each UTF-8 byte of word]
    return [BYTE_IDS[byte] for byte in word.encode("utf-8")]


def spelled_tokens(merges):  # -> [spelled token of each id], <|endoftext|> last, as in Hugging Face's vocab.json
    spelled = list(bytes_to_unicode().values())  # in GPT-2's byte order, like BYTE_IDS
    for left, right in merges:
        spelled.append(spelled[left] + spelled[right])
    return [*spelled, EOT]


def trained_tokenizer(merges):  # -> Tokenizer of the vocabulary that merges (from train_bpe) make
    spelled = spelled_tokens(merges)
    encoder = {token: token_id for token_id, token in enumerate(spelled)}
    return Tokenizer(encoder, [(spelled[left], spelled[right]) for left, right in merges])


def save_tokenizer(folder, merges):  # -> None: folder holds vocab.json + merges.txt of the vocabulary merges make
    """Write Hugging Face's GPT-2 tokenizer files as its trainer writes them: vocab.json maps each spelled token to
    its id, compact, in id order; merges.txt has the header line, then one "left right" line per merge, best first."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spelled = spelled_tokens(merges)
    vocab = json.dumps({token: token_id for token_id, token in enumerate(spelled)}, ensure_ascii=False,
                       separators=(",", ":"))
    lines = MERGES_HEADER + "".join(f"{spelled[left]} {spelled[right]}\n" for left, right in merges)
    atomic_write(folder / "vocab.json", lambda file: file.write(vocab.encode("utf-8")))
    atomic_write(folder / "merges.txt", lambda file: file.write(lines.encode("utf-8")))
