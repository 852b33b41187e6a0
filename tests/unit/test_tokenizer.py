"""The tokenizer against tiktoken's GPT-2 encoding built from OpenAI's official files, and tiktoken's known answers.

The files are the package's own copies (gpt2_numpy/data), so these tests run on any clone; tiktoken checks their
sha256 against the values it pins, and one test compares them byte for byte with ../shared/gpt2-official/124M."""
import json
import shutil
from functools import cache, partial

import numpy as np
import pytest
import tiktoken
import tiktoken.load

from gpt2_numpy import tokenizer as tokenizer_module
from gpt2_numpy.errors import OutOfVocabulary, TokenizerError
from gpt2_numpy.likelihood import text_ids
from gpt2_numpy.tokenizer import EOT, EOT_ID, PACKAGED_VOCABULARY, WORD_PATTERN, check_in_vocabulary, load_tokenizer
from tests.conftest import shared_path
from scripts.common.text_samples import LONG_WORD_ALPHABETS, large_texts, long_word, sample_strings

# the sha256 values tiktoken pins for its "gpt2" encoding: the reference is built from exactly OpenAI's files
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
N_STRINGS = 12_000


@pytest.fixture(scope="module")
def official():  # the folder of the package's copies of OpenAI's encoder.json and vocab.bpe
    return PACKAGED_VOCABULARY


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()  # no folder: the packaged files


@pytest.fixture(scope="module")
def reference(official):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", "")  # read the official files directly; leave no copies in /tmp
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            str(official / "vocab.bpe"), str(official / "encoder.json"), VOCAB_BPE_SHA256, ENCODER_JSON_SHA256
        )
    return tiktoken.Encoding("gpt2_official", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: 50256})


@pytest.fixture(scope="module")
def strings():
    return sample_strings(N_STRINGS, seed=0)


def mismatches(ours, theirs, inputs):  # -> the first few inputs on which the two functions disagree, for the report
    return [value for value in inputs if ours(value) != theirs(value)][:5]


def textbook_encoder(tokenizer):  # -> encode(text) that runs the textbook BPE (Tokenizer.textbook_bpe) on every word
    word_ids = cache(lambda word: tokenizer.textbook_bpe(word.encode("utf-8")))  # words repeat: each is run once
    return lambda text: [token_id for word in WORD_PATTERN.findall(text) for token_id in word_ids(word)]


def test_encode_matches_tiktoken_on_generated_strings(tokenizer, reference, strings):
    assert mismatches(tokenizer.encode, reference.encode_ordinary, strings) == []


def testtextbook_bpe_matches_tiktoken_on_generated_strings(tokenizer, reference, strings):
    assert mismatches(textbook_encoder(tokenizer), reference.encode_ordinary, strings) == []


@pytest.mark.parametrize("name", large_texts())
def testtextbook_bpe_matches_tiktoken_on_large_texts(tokenizer, reference, name):
    text = large_texts()[name]
    assert textbook_encoder(tokenizer)(text) == reference.encode_ordinary(text)


@pytest.mark.parametrize("name", large_texts())
def test_encode_matches_tiktoken_on_large_texts(tokenizer, reference, name):
    text = large_texts()[name]
    assert len(text) > 10_000
    assert tokenizer.encode(text) == reference.encode_ordinary(text)


@pytest.mark.parametrize(
    "text, ids",  # from tiktoken's tests/test_encoding.py
    [
        ("hello world", [31373, 995]),
        ("", []),
        ("0", [15]),
        ("00", [405]),
        ("000", [830]),
        ("0000", [2388]),
        ("00000", [20483]),
        ("000000", [10535]),
        ("0000000", [24598]),
        ("00000000", [8269]),
        ("000000000", [10535, 830]),
        ("0000000000000000", [25645]),
    ],
)
def test_known_answers(tokenizer, text, ids):
    assert tokenizer.encode(text) == textbook_encoder(tokenizer)(text) == ids
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("allowed", [{EOT}, "all"])
def test_allowed_end_of_text_becomes_its_id(tokenizer, allowed):
    assert tokenizer.encode("hello <|endoftext|>", allowed_special=allowed) == [31373, 220, 50256]


@pytest.mark.parametrize("allowed", [(), set(), None])  # None: no special token, as the default (was a TypeError)
def test_end_of_text_is_ordinary_text_by_default(tokenizer, reference, allowed):
    text = "a<|endoftext|>b <|endoftext|>"
    assert EOT_ID not in tokenizer.encode(text, allowed_special=allowed)
    assert tokenizer.encode(text, allowed_special=allowed) == reference.encode_ordinary(text)


def test_allowed_end_of_text_matches_tiktoken(tokenizer, reference, strings):
    joined = [EOT.join(strings[n : n + 3]) + EOT * (n % 2) for n in range(0, 600, 3)]
    ours, theirs = partial(tokenizer.encode, allowed_special="all"), partial(reference.encode, allowed_special="all")
    assert mismatches(ours, theirs, joined) == []


def test_a_scored_text_holds_end_of_text_as_its_one_id(tokenizer, reference):
    # written in a scored text, <|endoftext|> is the document separator, as generate reads it: one token, not seven
    text = "a<|endoftext|>b"
    expected = reference.encode(text, allowed_special="all")
    assert expected.count(EOT_ID) == 1
    assert text_ids(tokenizer, text, 50257, bos=False) == expected
    assert text_ids(tokenizer, text, 50257, bos=True) == [EOT_ID, *expected]


def test_ids_up_to_the_last_of_the_model_are_in_its_vocabulary(tokenizer):
    # the boundary: a model of n_vocab tokens has ids 0 .. n_vocab - 1; "!" is id 0, " the" 262
    assert check_in_vocabulary(tokenizer, [0, 262], 263, "the text", "fix it") == [0, 262]
    with pytest.raises(OutOfVocabulary, match=r"^the text's token 262 \(' the', position 1\) is outside this model's "
                       r"vocabulary of 262 tokens: fix it$"):
        check_in_vocabulary(tokenizer, [0, 262], 262, "the text", "fix it")


def test_vocabulary_facts(tokenizer, reference):
    assert (tokenizer.n_vocab, EOT_ID) == (reference.n_vocab, reference.eot_token) == (50257, 50256)
    assert tokenizer.decode([EOT_ID]) == EOT


@pytest.mark.slow
@pytest.mark.parametrize("bpe", ["_bpe", "textbook_bpe"])
def test_every_token_is_rebuilt_by_merging_its_bytes(tokenizer, bpe):
    # why encode may take a word that is itself a token without running BPE: BPE would end at that token anyway
    token_ids = range(EOT_ID)  # every id but <|endoftext|>, the last
    bpe = getattr(tokenizer, bpe)
    assert [token_id for token_id in token_ids if bpe(tokenizer.token_bytes(token_id)) != [token_id]] == []


TEXTBOOK_WORD_CHARS = 1_001  # odd, so the runs of one letter end with a part left alone
LONG_WORDS = {
    **{f"random {kind}": long_word(kind, 10_000, seed=3) for kind in LONG_WORD_ALPHABETS},
    # runs of one pair: equal ranks side by side, which must join left to right ("aaa" -> "aa a")
    "a run of one letter": "a" * 10_001,
    "a run of one symbol": "=" * 9_999,
    "alternating letters": "ab" * 5_000 + "a",
}


@pytest.mark.parametrize("name", LONG_WORDS)
def test_long_words_match_tiktoken(tokenizer, reference, name):
    word = LONG_WORDS[name]
    assert WORD_PATTERN.findall(word) == [word]  # one word, so BPE runs on all of it at once
    assert tokenizer.encode(word) == reference.encode_ordinary(word)


@pytest.mark.parametrize("name", LONG_WORDS)
def testtextbook_bpe_matches_tiktoken_on_the_start_of_long_words(tokenizer, reference, name):
    word = LONG_WORDS[name][:TEXTBOOK_WORD_CHARS]  # the textbook's work grows with the square of a word's length
    assert tokenizer.textbook_bpe(word.encode("utf-8")) == tokenizer._bpe(word.encode("utf-8"))
    assert tokenizer.textbook_bpe(word.encode("utf-8")) == reference.encode_ordinary(word)


BENCHMARK_PIECES = {  # scripts/bench/tokenizer.py's long pieces at its smaller size, and runs of one pair
    **{f"random {kind}, 100 KB": partial(long_word, kind, 100_000, seed=0) for kind in ("letters", "digits")},
    "a run of one digit, 100 KB": partial(str.__mul__, "7", 100_000),
    "alternating letters, 100 KB": partial(str.__mul__, "ab", 50_000),
}


@pytest.mark.parametrize("name", BENCHMARK_PIECES)
def test_benchmark_sized_pieces_match_tiktoken(tokenizer, reference, name):
    # BPE's lists at a size where their memory layout matters (positions shared by before, after and the buckets)
    word = BENCHMARK_PIECES[name]()
    assert WORD_PATTERN.findall(word) == [word]
    assert tokenizer.encode(word) == reference.encode_ordinary(word)


class CountingDict(dict):
    """A dict that counts its get() calls."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def test_bpe_work_grows_linearly_with_word_length(tokenizer, monkeypatch):
    # every candidate merge BPE handles starts as one pair-rank lookup: 10x the letters must cost about 10x the lookups,
    # where rescanning all pairs after each merge costs ~100x; no timing, so a busy machine cannot make this flaky
    def lookups(n_letters):  # -> pair-rank lookups to encode one word of n_letters random letters
        counting = CountingDict(tokenizer._pair_ranks)
        monkeypatch.setattr(tokenizer, "_pair_ranks", counting)
        tokenizer._bpe(long_word("letters", n_letters).encode())
        return counting.lookups

    short, long = lookups(2_000), lookups(20_000)
    assert short >= 2_000 - 1  # at least every adjacent pair is looked up once
    assert long / short < 12


@pytest.mark.parametrize(
    "text",
    [
        "\ud800",  # a lone high surrogate
        "\udfff",  # a lone low surrogate
        "ab\ud800cd",  # inside a word
        " \udc00\udc00 x",  # two lone low ones in a row, after a space
        "\ude00\ud83d",  # low then high: not a pair, two lone ones
        "hi \ud83d\ude00!",  # a pair: one emoji, U+1F600
        "x\ud835\udc00bc",  # a pair that is a letter, U+1D400, so it joins the letters around it into one word
        "\ud83d\ud83d\ude00",  # a lone high one, then a pair
    ],
)
def test_surrogates_match_tiktoken(tokenizer, reference, text):
    assert tokenizer.encode(text) == reference.encode_ordinary(text)
    with_special = text + EOT + text  # the special-token path splits the text before encoding the pieces
    expected = reference.encode(with_special, allowed_special="all")
    assert tokenizer.encode(with_special, allowed_special="all") == expected


def test_round_trip(tokenizer, strings):
    assert [text for text in strings if tokenizer.decode(tokenizer.encode(text)) != text] == []


def random_id_runs(count, seed=0):  # -> id lists, about half of the ids single bytes, so characters are often cut
    rng = np.random.default_rng(seed)
    pool = np.concatenate([np.arange(256).repeat(200), np.arange(50257)])  # GPT-2's ids 0..255 are the byte tokens
    return [rng.choice(pool, rng.integers(1, 12)).tolist() for _ in range(count)]


def test_decode_matches_tiktoken_on_random_ids(tokenizer, reference):
    assert mismatches(tokenizer.decode, reference.decode, random_id_runs(3000)) == []


def test_decode_of_a_cut_character_uses_replacement(tokenizer, reference):
    ids = reference.encode_ordinary("🤖")
    assert len(ids) > 1 and tokenizer.decode(ids[:-1]) == reference.decode(ids[:-1]) == "\ufffd"


def stream(tokenizer, ids):  # -> [text returned by each add(), then by finish()]
    decoder = tokenizer.stream_decoder()
    return [decoder.add(token_id) for token_id in ids] + [decoder.finish()]


@pytest.mark.slow
def test_stream_decoder_emits_each_character_once_complete(tokenizer, reference, strings):
    for text in strings:
        if "\ufffd" in text:
            continue
        ids = tokenizer.encode(text)
        pieces = stream(tokenizer, ids)
        assert "".join(pieces) == text
        # after each id: exactly the whole characters so far, i.e. tiktoken's decode without its replacement char
        assert ["".join(pieces[: n + 1]) for n in range(len(ids))] == [
            reference.decode(ids[: n + 1]).removesuffix("\ufffd") for n in range(len(ids))
        ]


def test_stream_decoder_matches_decode_on_random_ids(tokenizer, reference):
    assert mismatches(lambda ids: "".join(stream(tokenizer, ids)), reference.decode, random_id_runs(3000, seed=1)) == []


def test_token_text_shows_a_piece_of_a_character_as_its_bytes(tokenizer, reference):
    # tiktoken's bytes of each token, decoded by hand: a whole character as itself, a piece as \x escapes
    emoji = reference.encode_ordinary("\N{GRINNING FACE}")  # its four UTF-8 bytes F0 9F 98 80 span two tokens
    assert [tokenizer.token_text(token_id) for token_id in emoji] == ["\\xf0\\x9f\\x98", "\\x80"]
    cafe = " caf\N{LATIN SMALL LETTER E WITH ACUTE}"  # one token, whose last character is two bytes
    assert [tokenizer.token_text(token_id) for token_id in reference.encode_ordinary(cafe)] == [cafe]
    assert tokenizer.token_text(np.int64(EOT_ID)) == EOT


def test_small_cache_changes_nothing(official, reference, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "CACHE_SIZE", 10)
    small = load_tokenizer(official)
    text = large_texts()["generated mix"]
    assert small.encode(text) == reference.encode_ordinary(text)
    assert len(small._cache) <= 10


def test_decode_takes_numpy_ids(tokenizer):
    assert tokenizer.decode(np.array([31373, 995])) == "hello world"


@pytest.mark.parametrize("text", [b"hello", None, ["hello"]])
def test_encode_rejects_non_strings(tokenizer, text):
    with pytest.raises(TypeError, match="encode.. takes a str"):
        tokenizer.encode(text)


@pytest.mark.parametrize("allowed", [{"<|startoftext|>"}, EOT])
def test_encode_rejects_unknown_allowed_special(tokenizer, allowed):
    with pytest.raises(ValueError, match="allowed_special"):
        tokenizer.encode("hi", allowed_special=allowed)


@pytest.mark.parametrize("ids", [[50257], [-1], [31373, 10**9]])
def test_ids_outside_the_vocabulary_raise(tokenizer, ids):
    with pytest.raises(ValueError, match="outside the vocabulary: ids run from 0 to 50256"):
        tokenizer.decode(ids)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        stream(tokenizer, ids)


def test_hugging_face_file_names(official, reference, strings, tmp_path):
    # Hugging Face's vocab.json / merges.txt hold the same data; write it with other JSON spacing, as HF does
    encoder = json.loads((official / "encoder.json").read_text(encoding="utf-8"))
    (tmp_path / "vocab.json").write_text(json.dumps(encoder, ensure_ascii=False, indent=2), encoding="utf-8")
    shutil.copyfile(official / "vocab.bpe", tmp_path / "merges.txt")
    hugging_face = load_tokenizer(tmp_path)
    assert mismatches(hugging_face.encode, reference.encode_ordinary, strings[:1000]) == []


def write_official_copy(official, folder, **replacements):  # -> folder with the two files, some replaced by bytes
    for name in ("encoder.json", "vocab.bpe"):
        if name in replacements:
            (folder / name).write_bytes(replacements[name])
        else:
            shutil.copyfile(official / name, folder / name)
    return folder


@pytest.mark.parametrize(
    "replacements, message",
    [
        ({"encoder.json": b'{"a": 0,'}, r"encoder\.json is malformed: it is not valid JSON"),
        ({"encoder.json": b"[1, 2]"}, r"encoder\.json is malformed: it must be one JSON object"),
        ({"encoder.json": b'{"a": 0, "b": 0}'}, r"encoder\.json is malformed: it must be one JSON object"),
        ({"encoder.json": b'{"a": 0}'}, r"encoder\.json is malformed: it lacks single-byte tokens"),
        ({"encoder.json": b"\xff\xfe"}, r"encoder\.json is malformed: it is not UTF-8"),
        ({"encoder.json": b'{"a": "0"}'}, r"encoder\.json is malformed: it must be one JSON object"),
        ({"encoder.json": b'{"a": 1, "b": "0"}'}, r"encoder\.json is malformed: it must be one JSON object"),
        ({"vocab.bpe": b"#version: 0.2\n\xc4\xa0 t\nnot-a-pair\n"}, r"vocab\.bpe is malformed: line 3 \('not-a-pair'"),
        ({"vocab.bpe": b"#version: 0.2\nx qqqqqqqqqqqq\n"}, r"vocab\.bpe is malformed: line 2"),
    ],
)
def test_malformed_files_name_the_file(official, tmp_path, replacements, message):
    with pytest.raises(TokenizerError, match=message + ".*download the model again"):
        load_tokenizer(write_official_copy(official, tmp_path, **replacements))


def test_a_vocab_bpe_with_crlf_line_ends_encodes_as_the_official_one(official, reference, strings, tmp_path):
    # as a checkout with Windows line ends (git's autocrlf) or a copy through an editor leaves it
    crlf = (official / "vocab.bpe").read_bytes().replace(b"\n", b"\r\n")
    windows = load_tokenizer(write_official_copy(official, tmp_path, **{"vocab.bpe": crlf}))
    assert mismatches(windows.encode, reference.encode_ordinary, strings[:1000]) == []


def test_a_cut_off_merges_file_is_refused(official, tmp_path):
    cut = (official / "vocab.bpe").read_bytes()[:100_000]
    cut = cut[: cut.rindex(b"\n") + 1]  # whole lines only, as an interrupted copy might leave
    with pytest.raises(TokenizerError, match=r"vocab\.bpe is malformed: it has [\d,]+ merges but the vocabulary needs "
                       r"50,000.*download the model again"):
        load_tokenizer(write_official_copy(official, tmp_path, **{"vocab.bpe": cut}))


def test_stray_characters_in_encoder_json(official, tmp_path):
    encoder = json.loads((official / "encoder.json").read_text(encoding="utf-8"))
    encoder["hello world"] = encoder.pop("Ġworld")  # a real space never appears in a spelled token
    bad = json.dumps(encoder).encode("utf-8")
    with pytest.raises(TokenizerError, match=r"encoder\.json is malformed: some tokens have characters outside"):
        load_tokenizer(write_official_copy(official, tmp_path, **{"encoder.json": bad}))


def test_missing_merges_file_is_named(official, tmp_path):
    shutil.copyfile(official / "encoder.json", tmp_path / "encoder.json")
    with pytest.raises(TokenizerError, match=r"vocab\.bpe is missing: download the model again"):
        load_tokenizer(tmp_path)


def test_folder_without_vocabulary(tmp_path):
    expected = r"no vocabulary in .*: expected encoder\.json \+ vocab\.bpe \(OpenAI\) or vocab\.json \+ merges\.txt"
    with pytest.raises(TokenizerError, match=expected):
        load_tokenizer(tmp_path)


def test_long_words_are_encoded_but_not_remembered(official, reference):
    tokenizer = load_tokenizer(official)
    long_word = "x" * 5000
    assert tokenizer.encode(long_word) == tokenizer.encode(long_word) == reference.encode_ordinary(long_word)
    assert tokenizer.encode("hello hello") == reference.encode_ordinary("hello hello")
    remembered = set(tokenizer._cache)
    assert long_word not in remembered and {"hello", " hello"} <= remembered


@pytest.mark.parametrize("name", ["encoder.json", "vocab.bpe"])
def test_packaged_files_are_the_official_ones(name):
    assert (PACKAGED_VOCABULARY / name).read_bytes() == shared_path(f"124M/{name}").read_bytes()


def test_a_model_folder_uses_its_own_files(official, tmp_path):
    # a folder's files win over the packaged ones: here a vocabulary with the ids of "hello" and " world" swapped
    encoder = json.loads((official / "encoder.json").read_text(encoding="utf-8"))
    encoder["hello"], encoder["Ġworld"] = encoder["Ġworld"], encoder["hello"]
    swapped = json.dumps(encoder).encode("utf-8")
    assert load_tokenizer(write_official_copy(official, tmp_path, **{"encoder.json": swapped})).encode(
        "hello world") == [995, 31373]
    assert load_tokenizer().encode("hello world") == [31373, 995]


def test_token_windows_start_every_seq_len_ids_with_their_targets_overlapping_by_one():
    ids = np.arange(10)
    assert tokenizer_module.token_windows(ids, 3).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert tokenizer_module.token_windows(ids, 3, targets=True).tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    # 9 ids: the third window would have no target for its last input
    assert tokenizer_module.token_windows(ids[:9], 3, targets=True).tolist() == [[0, 1, 2, 3], [3, 4, 5, 6]]
    assert tokenizer_module.token_windows(ids, 3, n_windows=2).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert tokenizer_module.token_windows(ids[:2], 3).shape == (0, 3)
    assert tokenizer_module.token_windows(ids[:3], 3, targets=True).shape == (0, 4)  # no target for the last
