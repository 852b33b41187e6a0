"""BPE training against Hugging Face's trainer, and trained vocabularies against transformers' GPT2TokenizerFast.

The references come from scripts/fixtures/make_bpe_reference.py (tests/fixtures/bpe_reference.json and
bpe_shakespeare_4096.merges.txt.gz); texts from the Shakespeare corpus are read from ../shared/corpus."""
import gzip
import hashlib
import json
import random

import pytest

from gpt2_numpy import tokenizer_train
from gpt2_numpy.errors import CheckpointError, TokenizerError
from gpt2_numpy.formats.vocabulary import check_model_vocabulary
from gpt2_numpy.tokenizer import EOT, PACKAGED_VOCABULARY, WORD_PATTERN, load_tokenizer
from gpt2_numpy.tokenizer_train import save_tokenizer, spelled_tokens, train_bpe, train_bpe_textbook, trained_tokenizer
from tests.conftest import FIXTURES, REPO, missing
from scripts.common.text_samples import few_letter_text, sample_strings

REFERENCE = json.loads((FIXTURES / "bpe_reference.json").read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in REFERENCE["training"]}
CORPUS = REPO.parent / "shared" / "corpus" / "shakespeare-plays.txt"  # read from there, never copied into the repo
TEXTBOOK_MAX_CHARS = 40_000  # the textbook recounts every pair after each merge: longer texts take too long for a test


@pytest.fixture(scope="module")
def corpus():
    if not CORPUS.exists():
        missing(f"{CORPUS} is missing: place the Shakespeare corpus in ../shared/corpus/ beside the repo")
    return CORPUS.read_text(encoding="utf-8")


def case_text(case, request):  # -> the training text of a reference case, read from the corpus for some
    if "corpus" in case:
        start, length = case["corpus"]
        return request.getfixturevalue("corpus")[start:start + length]
    return case["text"]


def spelled_merges(merges):  # -> ["left right"] as merges.txt spells them
    spelled = spelled_tokens(merges)
    return [f"{spelled[left]} {spelled[right]}" for left, right in merges]


@pytest.mark.parametrize("name", CASES)
def test_tuned_trainer_matches_hugging_face(name, request):
    case = CASES[name]
    text = case_text(case, request)
    merges = train_bpe(text, case["vocab_size"], case["min_frequency"], quiet=True)
    assert spelled_merges(merges) == case["merges"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name, case in CASES.items()
                                  if "text" in case or case["corpus"][1] <= TEXTBOOK_MAX_CHARS])
def test_textbook_trainer_matches_hugging_face(name, request):
    case = CASES[name]
    text = case_text(case, request)
    assert spelled_merges(train_bpe_textbook(text, case["vocab_size"], case["min_frequency"])) == case["merges"]


@pytest.mark.slow
def test_textbook_and_tuned_trainers_agree():
    rng = random.Random(1)
    for n in range(60):
        text = few_letter_text(rng, most=600) if n % 2 else "".join(sample_strings(rng.randint(1, 25), seed=n))
        vocab_size, min_frequency = rng.randint(257, 400), rng.choice([0, 1, 2, 3])
        tuned = train_bpe(text, vocab_size, min_frequency, quiet=True)
        assert tuned == train_bpe_textbook(text, vocab_size, min_frequency), (text, vocab_size, min_frequency)


@pytest.mark.slow
@pytest.mark.timeout(240)  # a few seconds alone; the whole corpus, on a machine others share
def test_whole_corpus_at_4096_matches_hugging_face(corpus, tmp_path):
    save_tokenizer(tmp_path, train_bpe(corpus, 4096, quiet=True))
    expected = gzip.decompress((FIXTURES / "bpe_shakespeare_4096.merges.txt.gz").read_bytes())
    assert (tmp_path / "merges.txt").read_bytes() == expected  # the merges, in order, and the file as HF writes it


def test_tuned_trainer_touches_only_the_words_holding_each_pair(monkeypatch, corpus):
    # the textbook rewrites every word after every merge; the tuned trainer only those that hold the merged pair
    calls, replace_pair = [], tokenizer_train.replace_pair

    def counted_replace_pair(*args):
        calls.append(args)
        return replace_pair(*args)

    monkeypatch.setattr(tokenizer_train, "replace_pair", counted_replace_pair)
    text = corpus[:300_000]
    n_words, n_merges = len(set(WORD_PATTERN.findall(text))), len(train_bpe(text, 1000, quiet=True))
    assert n_merges == 1000 - 257
    assert len(calls) < n_words * n_merges / 20


@pytest.mark.parametrize("encoding", REFERENCE["encoding"], ids=lambda encoding: encoding["training"])
def test_saved_folder_gives_gpt2_tokenizer_fast_ids(encoding, request, tmp_path):
    case = CASES[encoding["training"]]
    text = case_text(case, request)
    save_tokenizer(tmp_path, train_bpe(text, case["vocab_size"], case["min_frequency"], quiet=True))
    # the files GPT2TokenizerFast loaded when the reference was made: so it loads ours as they are written today
    sha256 = {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() for name in encoding["files_sha256"]}
    assert sha256 == encoding["files_sha256"]
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.eot_id == tokenizer.n_vocab - 1 == 256 + len(case["merges"])  # last, after bytes and merges
    ours = [tokenizer.encode(text, allowed_special="all") for text in REFERENCE["probe_texts"]]
    assert ours == encoding["ids"]
    # the textbook encode of each word gives the same ids (these texts hold <|endoftext|> only as ordinary text)
    plain = [(text, ids) for text, ids in zip(REFERENCE["probe_texts"], encoding["ids"]) if EOT not in text]
    textbook = [[i for word in WORD_PATTERN.findall(text) for i in tokenizer.textbook_bpe(word.encode())]
                for text, _ in plain]
    assert textbook == [ids for _, ids in plain]


def test_ids_follow_gpt2s_convention():
    merges = train_bpe("".join(sample_strings(60, seed=3)), 400, quiet=True)
    tokenizer = trained_tokenizer(merges)
    official = json.loads((PACKAGED_VOCABULARY / "encoder.json").read_text(encoding="utf-8"))
    assert [*tokenizer.encoder][:256] == [*official][:256]  # the bytes, in GPT-2's order and with its ids
    assert all(tokenizer.encoder[token] == official[token] for token in [*official][:256])
    assert len(merges) == 400 - 257 and tokenizer.n_vocab == 400
    joined = [tokenizer.token_bytes(left) + tokenizer.token_bytes(right) for left, right in merges]
    assert [tokenizer.token_bytes(256 + k) for k in range(len(merges))] == joined  # merge k makes id 256 + k
    assert (tokenizer.eot_id, tokenizer.decode([399])) == (399, EOT)


def test_training_stops_where_no_pair_is_frequent_enough():
    # "ab" twice, "cd" once: only (a, b) reaches min_frequency 2, however large the vocabulary asked for
    merges = train_bpe("ab ab cd", 1000, quiet=True)
    tokenizer = trained_tokenizer(merges)
    assert [tokenizer.token_bytes(256 + k) for k in range(len(merges))] == [b"ab"]
    assert tokenizer.n_vocab == 258


@pytest.mark.parametrize("vocab_size", [256, 0, -5])
def test_vocab_size_below_257_is_refused(vocab_size):
    for train in (train_bpe, train_bpe_textbook):
        with pytest.raises(ValueError, match="at least 257"):
            train("hello", vocab_size)


def test_progress_bar_counts_merges_on_stderr(capsys):
    train_bpe("ab ab cd cd", 259)
    assert "2/2" in capsys.readouterr().err
    train_bpe("ab ab cd cd", 259, quiet=True)
    assert capsys.readouterr().err == ""


@pytest.fixture
def trained_folder(tmp_path):  # a folder holding a small trained vocabulary, whose files the tests below break
    save_tokenizer(tmp_path, train_bpe("".join(sample_strings(60, seed=3)), 400, quiet=True))
    return tmp_path


def replace_line(path, number, line):  # rewrite line `number` (1-based) of a text file
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[number - 1] = line
    path.write_text("\n".join(lines), encoding="utf-8")


@pytest.mark.parametrize(
    "line, message",
    [
        ("one-token", r"line 5 \('one-token'\) is not two tokens"),
        ("Ġ t h", r"line 5 \('Ġ t h'\) is not two tokens"),
        ("Ġqqq qqq", r"line 5 \('Ġqqq qqq'\) is not two tokens whose join is a token"),  # not in the vocabulary
    ],
)
def test_broken_merges_are_refused(trained_folder, line, message):
    replace_line(trained_folder / "merges.txt", 5, line)
    with pytest.raises(TokenizerError, match=r"merges\.txt is malformed: " + message):
        load_tokenizer(trained_folder)


def test_a_vocabulary_missing_a_byte_is_refused(trained_folder):
    vocab = json.loads((trained_folder / "vocab.json").read_text(encoding="utf-8"))
    del vocab["Ā"]  # the byte 0x00
    vocab = {token: token_id for token_id, token in enumerate(vocab)}  # ids 0..n-1 still
    (trained_folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"vocab\.json is malformed: it lacks single-byte tokens"):
        load_tokenizer(trained_folder)


def test_a_cut_off_trained_merges_file_is_refused(trained_folder):
    path = trained_folder / "merges.txt"
    path.write_text("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:-10]), encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"it has 133 merges but the vocabulary needs 143"):
        load_tokenizer(trained_folder)


@pytest.mark.parametrize("n_vocab", [399, 401, 50257])
def test_a_model_of_another_vocabulary_size_is_refused(trained_folder, n_vocab):
    n_tokens = load_tokenizer(trained_folder).n_vocab
    check_model_vocabulary(n_tokens, 400, trained_folder, exact=True)  # its own size passes
    only = "only " if n_tokens < n_vocab else ""
    with pytest.raises(CheckpointError, match=f"the model has {n_vocab:,} tokens but its vocabulary files {only}400"):
        check_model_vocabulary(n_tokens, n_vocab, trained_folder, exact=True)
    if n_tokens > n_vocab:  # a model that reads only the first n_vocab tokens, e.g. a small one on GPT-2's vocabulary
        check_model_vocabulary(n_tokens, n_vocab, trained_folder)
