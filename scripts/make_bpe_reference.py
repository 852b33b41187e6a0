"""Build the BPE training references of tests/test_tokenizer_train.py from Hugging Face `tokenizers` and `transformers`.

tests/fixtures/bpe_reference.json:
- "training": texts, each with a vocabulary size and min_frequency, and the merges Hugging Face's BpeTrainer learns on
  it (ByteLevel pre-tokenizer with use_regex=True, add_prefix_space=False; the 256 bytes as initial alphabet; the
  special token <|endoftext|>), as the lines of the merges.txt it saves. A text is given inline, or as "corpus":
  [start, length], characters of ../shared/corpus/shakespeare-plays.txt (read from there, never copied).
- "encoding": for some of those texts, the ids `transformers.GPT2TokenizerFast` gives each of "probe_texts"
  (<|endoftext|> included) when it loads the folder that gpt2_numpy.tokenizer_train.save_tokenizer wrote for OUR
  trainer's merges, which this script first checks are Hugging Face's; and the sha256 of the two files it loaded.
tests/fixtures/bpe_shakespeare_4096.merges.txt.gz: the merges.txt Hugging Face saves after training on the whole
corpus to 4,096 tokens.

Rerun (the reference tools live in a venv outside the repo; they are never runtime dependencies):
    ../refvenv/bin/python scripts/make_bpe_reference.py
"""
import argparse
import gzip
import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # gpt2_numpy and tests.text_samples from this checkout

from gpt2_numpy.tokenizer import EOT  # noqa: E402
from gpt2_numpy.tokenizer_train import save_tokenizer, spelled_tokens, train_bpe  # noqa: E402
from tests.text_samples import few_letter_text, sample_strings  # noqa: E402

try:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]
else:
    MISSING = None

FIXTURES = REPO / "tests" / "fixtures"
CORPUS = REPO.parent / "shared" / "corpus" / "shakespeare-plays.txt"
CORPUS_VOCAB_SIZE = 4096
N_FEW_LETTER_TEXTS, N_MIXED_TEXTS = 24, 8
ENCODED_TRAININGS = ("corpus 0-100000", "mixed 0", "few letters 3")  # names up to " at SIZE"


def hf_merges_txt(text, vocab_size, min_frequency):  # -> the merges.txt Hugging Face saves after training on text
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text], trainer)
    with tempfile.TemporaryDirectory() as folder:
        return Path(tokenizer.model.save(folder)[1]).read_text(encoding="utf-8")


def hf_merges(text, vocab_size, min_frequency):  # -> Hugging Face's merges, "left right", best first
    header, *lines = hf_merges_txt(text, vocab_size, min_frequency).splitlines()
    assert header == "#version: 0.2", header
    return lines


def training_cases():  # -> [{"name", "text" or "corpus", "vocab_size", "min_frequency"}]
    rng = random.Random(0)
    cases = [{"name": f"corpus {start}-{start + length} at {size}", "corpus": [start, length], "vocab_size": size,
              "min_frequency": 2} for start, length, size in [(0, 100_000, 1000), (2_000_000, 300_000, 2000),
                                                               (4_000_000, 30_000, 300)]]
    for n in range(N_FEW_LETTER_TEXTS):  # many ties; min_frequency 1 and 3 too, and sizes the text cannot reach
        cases.append({"name": f"few letters {n} at {(size := rng.randint(257, 340))}", "text": few_letter_text(rng),
                      "vocab_size": size, "min_frequency": rng.choice([1, 2, 2, 3])})
    for n in range(N_MIXED_TEXTS):  # emoji, CJK, accents, code, spaces: ties between bytes far apart in GPT-2's order
        text = "".join(sample_strings(40, seed=n))
        cases.append({"name": f"mixed {n} at {(size := rng.choice([300, 400, 600]))}", "text": text,
                      "vocab_size": size, "min_frequency": 2})
    cases.append({"name": "with <|endoftext|> at 320", "text": EOT.join(["a cat sat", " on the mat", "", "<|end"]) * 3,
                  "vocab_size": 320, "min_frequency": 2})
    return cases


def case_text(case, corpus):
    if "corpus" in case:
        start, length = case["corpus"]
        return corpus[start:start + length]
    return case["text"]


def probe_texts(corpus):  # -> texts to encode: generated corners, <|endoftext|> between and inside, Shakespeare lines
    strings = sample_strings(120, seed=7)
    joined = [EOT.join(strings[n:n + 3]) for n in range(0, 30, 3)]
    return [*strings, *joined, EOT, " " + EOT + " ", "<|endoftext", *corpus[4_500_000:4_510_000].splitlines()[:60]]


def encoding_case(case, text, texts):  # -> {"training", "files_sha256", "ids"}: GPT2TokenizerFast's ids of texts
    merges = train_bpe(text, case["vocab_size"], case["min_frequency"], quiet=True)
    spelled = spelled_tokens(merges)
    assert [f"{spelled[left]} {spelled[right]}" for left, right in merges] == case["merges"], case["name"]  # HF's
    with tempfile.TemporaryDirectory() as folder:
        save_tokenizer(folder, merges)
        hf = GPT2TokenizerFast.from_pretrained(folder)
        sha256 = {file.name: hashlib.sha256(file.read_bytes()).hexdigest() for file in Path(folder).iterdir()}
        ids = [hf.encode(text) for text in texts]
    assert hf.convert_tokens_to_ids(EOT) == len(spelled) - 1  # <|endoftext|> is the last id
    return {"training": case["name"], "files_sha256": sha256, "ids": ids}


def main():
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if MISSING:
        sys.exit(f"error: {MISSING} is missing: run this script with ../refvenv/bin/python, which has tokenizers and "
                 "transformers")
    corpus = CORPUS.read_text(encoding="utf-8")
    cases = training_cases()
    for case in cases:
        case["merges"] = hf_merges(case_text(case, corpus), case["vocab_size"], case["min_frequency"])
    texts = probe_texts(corpus)
    encoded = [case for case in cases if case["name"].partition(" at ")[0] in ENCODED_TRAININGS]
    encodings = [encoding_case(case, case_text(case, corpus), texts) for case in encoded]
    reference = {"training": cases, "probe_texts": texts, "encoding": encodings}
    reference = json.dumps(reference, ensure_ascii=False, separators=(",", ":"))
    (FIXTURES / "bpe_reference.json").write_text(reference, encoding="utf-8")
    corpus_merges = hf_merges_txt(corpus, CORPUS_VOCAB_SIZE, 2).encode("utf-8")
    # mtime=0: the same merges give the same bytes on every run
    (FIXTURES / "bpe_shakespeare_4096.merges.txt.gz").write_bytes(gzip.compress(corpus_merges, mtime=0))


if __name__ == "__main__":
    main()
