"""GPT-2's vocabulary files, read and checked: OpenAI's encoder.json + vocab.bpe, or Hugging Face's vocab.json +
merges.txt (the same two tables in other names). The first maps each token, spelled in stand-in characters (one per
byte, bytes_to_unicode), to its id; the second lists the merges, best first, one "left right" pair a line. The
tokenizer (gpt2_numpy/tokenizer.py) is built from what these return.
"""
from contextlib import contextmanager

from gpt2_numpy.errors import CheckpointError, TokenizerError
from gpt2_numpy.formats import TABLE_LIMIT, parse_json, read_text

EOT = "<|endoftext|>"
FILE_NAMES = {"OpenAI": ("encoder.json", "vocab.bpe"), "Hugging Face": ("vocab.json", "merges.txt")}


def bytes_to_unicode():  # -> {byte value: stand-in character}
    # printable Latin-1 bytes stand for themselves; the other 68 (controls, space, ...) take chr(256), chr(257), ...
    # in byte order, so every token is visible, space-free text in the vocabulary files
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {**{byte: chr(byte) for byte in printable}, **{byte: chr(256 + n) for n, byte in enumerate(others)}}


def read_vocabulary(model_dir):  # -> ({spelled token: id}, [(left, right)]) of the vocabulary files in model_dir
    vocab, merges = vocabulary_files(model_dir)
    with comparing(vocab):
        encoder = read_encoder(vocab)
    with comparing(merges, vocab):  # the merges must build exactly the tokens of the vocabulary
        return encoder, read_merges(merges, encoder)


def vocabulary_files(model_dir):  # -> (token ids, merges) paths of the layout present in model_dir, OpenAI's first
    for vocab_name, merges_name in FILE_NAMES.values():
        if exists(model_dir / vocab_name):
            return model_dir / vocab_name, model_dir / merges_name
    expected = " or ".join(f"{vocab} + {merges} ({source})" for source, (vocab, merges) in FILE_NAMES.items())
    raise TokenizerError(f"no vocabulary in {model_dir}: expected {expected}; download the model into that folder")


@contextmanager
def comparing(*paths):  # a TokenizerError inside names the files its check compared, the one at fault first (to blame)
    try:
        yield
    except TokenizerError as error:
        raise TokenizerError(str(error), files=paths) from None


def check_model_vocabulary(n_tokens, n_vocab, where, files=(), exact=False):  # -> None, or CheckpointError
    """A model's vocabulary files against its n_vocab (every loader and the verifier ask this one question). Fewer
    tokens than the model's: it could choose ids the tokenizer cannot print. More are fine for a model that reads only
    GPT-2's first n_vocab tokens, but a tokenizer trained for the model (exact, a training run's own) has exactly its
    ids, or the text would become other tokens than it learned. files: what the check compared, for blame."""
    if n_tokens < n_vocab or (exact and n_tokens != n_vocab):
        only = "only " if n_tokens < n_vocab else ""
        raise CheckpointError(f"{where}: the model has {n_vocab:,} tokens but its vocabulary files {only}{n_tokens:,}; "
                              "put the vocabulary files the model was trained with beside it", files=files)


def exists(path):  # -> bool; TokenizerError when the folder cannot be read at all
    try:  # a FIFO or a folder under a vocabulary file's name is refused by read_table, naming it
        return path.exists()
    except OSError as error:
        raise TokenizerError(f"cannot read {path.parent} ({error.strerror}): check its permissions") from None


def read_encoder(path):  # -> {spelled token: id}, checked to be ids 0..n-1 over the byte alphabet, with <|endoftext|>
    try:
        encoder = parse_json(read_table(path))
    except ValueError as error:  # parse_json's, which also refuses JSON nested deep enough to exhaust Python's stack
        raise malformed(path, f"it is not valid JSON ({error})") from None
    ids = encoder.values() if isinstance(encoder, dict) else [None]
    if not all(type(token_id) is int for token_id in ids) or sorted(ids) != list(range(len(encoder))):
        raise malformed(path, "it must be one JSON object mapping each token to a distinct id from 0 up")
    alphabet = set(bytes_to_unicode().values())
    if not alphabet <= encoder.keys() or EOT not in encoder:
        raise malformed(path, f"it lacks single-byte tokens or {EOT}")
    if not set("".join(encoder)) <= alphabet:
        raise malformed(path, "some tokens have characters outside GPT-2's byte alphabet")
    return encoder


def read_merges(path, encoder):  # -> [(left, right)], best first, each joining two tokens into a third
    merges = read_merge_lines(path, encoder)
    # every token beyond the 256 bytes and <|endoftext|> is made by exactly one merge: a cut file would encode wrongly
    if len(merges) != len(encoder) - 257:
        raise malformed(path, f"it has {len(merges):,} merges but the vocabulary needs {len(encoder) - 257:,}")
    return merges


def read_merge_lines(path, encoder):  # -> [(left, right)] as the file lists them
    merges = []
    for number, line in enumerate(read_table(path).split("\n"), start=1):
        if not line or (number == 1 and line.startswith("#version")):  # the header line and the final newline
            continue
        pair = tuple(line.split(" "))
        if len(pair) != 2 or pair[0] not in encoder or pair[1] not in encoder or "".join(pair) not in encoder:
            raise malformed(path, f"line {number} ({line!r}) is not two tokens whose join is a token")
        merges.append(pair)
    return merges


def read_table(path):  # -> the file's text, with "\n" for line ends as text mode reads them, or TokenizerError
    return read_text(path, lambda error: unreadable_vocabulary(path, error), TABLE_LIMIT).replace("\r\n", "\n")


def unreadable_vocabulary(path, error):  # OSError or UnicodeDecodeError -> TokenizerError naming the file
    if isinstance(error, FileNotFoundError):
        return TokenizerError(f"{path} is missing: download the model again to restore its vocabulary files")
    if isinstance(error, UnicodeDecodeError):
        return malformed(path, f"it is not UTF-8 text ({error.reason} at byte {error.start})")
    return TokenizerError(f"cannot read {path} ({error.strerror}): check that it is a readable file")


def malformed(path, problem):  # -> TokenizerError naming the file, the problem, and the fix
    return TokenizerError(f"{path} is malformed: {problem}; download the model again to replace it")
