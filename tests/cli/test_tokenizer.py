"""`gpt2-numpy tokenizer`: a tokenizer trained on a file and written as Hugging Face's GPT-2 files, or one error line.

The merges are held to the textbook trainer's (itself held to Hugging Face's by tests/unit/test_tokenizer_train.py),
and the files to the format's definition: `#version: 0.2`, then one merge a line; ids 0..N-1, <|endoftext|> last.
"""
import errno
import json
import os
import tempfile

import pytest

from gpt2_numpy import tokenizer_train
from gpt2_numpy.commands import tokenizer as tokenizer_command
from gpt2_numpy.commands.tokenizer import HF_TOKENIZER_FILES
from gpt2_numpy.errors import UsageError
from gpt2_numpy.tokenizer import load_tokenizer
from gpt2_numpy.tokenizer_train import spelled_tokens, train_bpe_textbook
from tests.conftest import assert_one_error_line
from tests.cli.test_train import run_cli

TEXT = "".join(f"the {word} and the {word}s of a {word}ed land.\n" for word in
               "king queen sea sand wind fire stone crown field river night".split()) * 3


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_it_writes_the_textbook_trainers_merges_in_hugging_faces_layout(tmp_path, data):
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 300, "--out", tmp_path / "tok")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'tok'}\n"
    merges = train_bpe_textbook(TEXT, 300)
    spelled = spelled_tokens(merges)
    lines = (tmp_path / "tok" / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines == ["#version: 0.2", *(f"{spelled[left]} {spelled[right]}" for left, right in merges)]
    vocab = json.loads((tmp_path / "tok" / "vocab.json").read_text(encoding="utf-8"))
    assert sorted(vocab.values()) == list(range(300)) and vocab["<|endoftext|>"] == 299
    tokenizer = load_tokenizer(tmp_path / "tok")
    assert tokenizer.decode(tokenizer.encode(TEXT)) == TEXT and tokenizer.eot_id == 299


def test_json_says_what_was_made(tmp_path, data):
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 280, "--out", tmp_path / "tok",
                     "--min-frequency", 3, "--json")
    assert result.returncode == 0, result.stderr
    made = json.loads(result.stdout)
    ids = load_tokenizer(tmp_path / "tok").encode(TEXT)
    merges = train_bpe_textbook(TEXT, 280, min_frequency=3)
    assert made == {"folder": str(tmp_path / "tok"), "vocab_size": 280, "merges": len(merges), "tokens": len(ids),
                    "bytes": len(TEXT.encode())}


def test_json_counts_the_texts_bytes_not_its_characters(tmp_path):
    data = tmp_path / "data.txt"
    text = "".join(f"{word} café → {word}𝄞 naïve {word}\n" for word in ("λόγος", "東京", "king", "Ωmega")) * 4
    data.write_text(text, encoding="utf-8")
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 280, "--out", tmp_path / "tok",
                     "--json")
    assert result.returncode == 0, result.stderr
    n_bytes = data.stat().st_size  # the file's own size: UTF-8 spends 2 to 4 bytes on each of these characters
    assert n_bytes > len(text)
    made = json.loads(result.stdout)
    assert made["bytes"] == n_bytes
    assert f"{made['tokens'] / n_bytes:.3f} per byte" in result.stderr


def test_a_text_too_small_says_how_large_a_vocabulary_it_makes(tmp_path, data):
    possible = 257 + len(train_bpe_textbook(TEXT, 10_000))  # every pair seen twice, merged
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 10_000, "--out", tmp_path / "tok")
    assert_one_error_line(result, f"ask for --vocab-size {possible} or less")
    assert not (tmp_path / "tok").exists()


def test_at_the_lowest_min_frequency_a_text_too_small_is_told_to_grow_not_to_lower_it(tmp_path, data):
    # it said "seen at least 1 times ... lower --min-frequency", which 1 already is
    possible = 257 + len(train_bpe_textbook(TEXT, 10_000, min_frequency=1))
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 10_000, "--min-frequency", 1, "--out",
                     tmp_path / "tok")
    assert_one_error_line(result, f"has only {possible - 257} pairs to merge, which make a vocabulary of {possible} "
                          f"tokens: ask for --vocab-size {possible} or less, or give more text")
    assert "min-frequency" not in result.stderr


def test_the_help_says_which_hugging_face_default_min_frequency_follows(capsys):
    # Hugging Face's BpeTrainer().min_frequency is 0, ByteLevelBPETokenizer.train's min_frequency 2 (tokenizers 0.22,
    # read from both); the help said "(2, as Hugging Face's BpeTrainer)"
    with pytest.raises(SystemExit):
        tokenizer_command.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    default = tokenizer_command.parse_args(["--data", "x", "--vocab-size", "300", "--out", "y"]).min_frequency
    assert f"({default}, as Hugging Face's ByteLevelBPETokenizer.train; its BpeTrainer's own default, 0," in help_text


@pytest.mark.slow
@pytest.mark.parametrize("flags, fragment", [
    (["--vocab-size", "256"], "--vocab-size: must be at least 257, got 256"),
    (["--vocab-size", "300", "--min-frequency", "0"], "--min-frequency: must be at least 1"),
])
def test_bad_flags_are_one_line(tmp_path, data, flags, fragment):
    assert_one_error_line(run_cli("gpt2_numpy", "tokenizer", "--data", data, "--out", tmp_path / "tok", *flags),
                          fragment)


def test_a_folder_holding_a_tokenizer_is_never_written_over(tmp_path, data):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "vocab.json").write_text("{}")
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 300, "--out", tmp_path / "model")
    assert_one_error_line(result, "already holds vocab.json")
    assert (tmp_path / "model" / "vocab.json").read_text() == "{}"


@pytest.mark.slow
@pytest.mark.parametrize("name", HF_TOKENIZER_FILES)
def test_a_folder_whose_hugging_face_files_would_win_is_refused(tmp_path, data, name):
    # GPT2TokenizerFast.from_pretrained reads tokenizer.json before vocab.json + merges.txt: an old one would load
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / name).write_text("{}")
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 300, "--out", tmp_path / "model")
    assert_one_error_line(result, f"holds {name}, which Hugging Face's loaders would read instead of the new files")
    assert [path.name for path in (tmp_path / "model").iterdir()] == [name]


def test_a_folder_below_a_file_is_refused_before_training(tmp_path, data):
    (tmp_path / "a_file").write_text("")
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 300, "--out",
                     tmp_path / "a_file" / "tok")
    assert_one_error_line(result, f"{tmp_path / 'a_file'} is a file, so no folder can be made below it")
    assert "merges" not in result.stderr  # no progress bar: refused before the training ran


@pytest.mark.parametrize("at", ["writing merges.txt", "naming merges.txt"])
def test_a_ctrl_c_while_writing_leaves_neither_file(tmp_path, data, monkeypatch, at):  # vocab.json stayed alone
    real_write, real_link = tokenizer_train.atomic_write, os.link

    def write(path, contents):
        if at == "writing merges.txt" and path.name == "merges.txt":
            raise KeyboardInterrupt
        real_write(path, contents)

    def link(source, target):
        if at == "naming merges.txt" and os.path.basename(target) == "merges.txt":
            raise KeyboardInterrupt
        real_link(source, target)

    monkeypatch.setattr(tokenizer_train, "atomic_write", write)
    monkeypatch.setattr(os, "link", link)
    out = tmp_path / "tok"
    with pytest.raises(KeyboardInterrupt):
        tokenizer_command.write_out(out, [])
    assert not out.exists()  # neither file, no staging folder, and the folder made for them gone too


def test_files_another_run_wrote_meanwhile_are_kept(tmp_path):  # they were replaced without a word
    out = tmp_path / "tok"
    out.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (out / name).write_text(f"the other run's {name}")
    with pytest.raises(UsageError, match="vocab.json appeared there while the vocabulary was trained"):
        tokenizer_command.write_out(out, [])
    assert {path.name: path.read_text() for path in out.iterdir()} == {
        name: f"the other run's {name}" for name in ("vocab.json", "merges.txt")}


def test_an_out_that_became_a_file_meanwhile_is_one_error(tmp_path):  # a TypeError from the message's own code
    (tmp_path / "tok").write_text("another program's file")
    with pytest.raises(UsageError, match="cannot write --out .*tok .File exists."):
        tokenizer_command.write_out(tmp_path / "tok", [])
    assert (tmp_path / "tok").read_text() == "another program's file"


def test_a_dangling_link_in_out_is_refused_before_training(tmp_path, data):  # it was blamed on another run, after
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.json").symlink_to(tmp_path / "nowhere.json")
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 300, "--out", tmp_path / "tok")
    assert_one_error_line(result, f"--out {tmp_path / 'tok'} already holds vocab.json")


@pytest.mark.slow
@pytest.mark.parametrize("out", ["link", "link/tok"])
def test_an_out_through_a_link_to_nothing_is_refused_before_training(tmp_path, data, out):  # "File exists", after
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    result = run_cli("gpt2_numpy", "tokenizer", "--data", data, "--vocab-size", 300, "--out", tmp_path / out)
    assert_one_error_line(result, f"--out {tmp_path / out}: {tmp_path / 'link'} is a symbolic link to "
                          f"{tmp_path / 'nowhere'}, which does not exist: create that folder, or choose another one")
    assert "merges" not in result.stderr  # no progress bar: refused before the training ran
    assert not os.path.lexists(tmp_path / "nowhere")


def read_only_file_system(monkeypatch, folder):  # -> None: making a file in folder fails as on a read-only disk,
    # where access(2) denies writing too (with EROFS, which os.access cannot report)
    real_file, real_access = tempfile.TemporaryFile, os.access

    def refused(*args, dir=None, **kwargs):
        if dir is not None and os.path.samefile(dir, folder):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real_file(*args, dir=dir, **kwargs)

    def access(path, mode, **kwargs):
        return not (mode & os.W_OK and os.path.samefile(path, folder)) and real_access(path, mode, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    monkeypatch.setattr(os, "access", access)


def test_a_read_only_file_system_is_named_as_such(tmp_path, data, monkeypatch, capsys):  # "permission denied"
    read_only_file_system(monkeypatch, tmp_path)
    with pytest.raises(SystemExit) as stop:
        tokenizer_command.main(["--data", str(data), "--vocab-size", "300", "--out", str(tmp_path / "tok")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --out {tmp_path / 'tok'}: cannot write into {tmp_path} (read-only file system): its file system is "
        "read-only: remount it writable or choose another folder")


def test_a_file_system_without_hard_links_gets_both_files(tmp_path, monkeypatch):
    def no_links(source, target):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    tokenizer_command.write_out(tmp_path / "tok", [])
    tokenizer = load_tokenizer(tmp_path / "tok")  # 256 bytes and no merge: a token per byte
    ids = tokenizer.encode("the king")
    assert len(ids) == 8 and tokenizer.decode(ids) == "the king"
    assert sorted(path.name for path in (tmp_path / "tok").iterdir()) == ["merges.txt", "vocab.json"]


@pytest.mark.parametrize("out", ["new/tok", "existing"])
def test_a_full_disk_leaves_neither_file_nor_the_folders_made(tmp_path, data, monkeypatch, capsys, out):
    # merges.txt, written second, meets a full disk: the vocab.json written first must not stay alone
    (tmp_path / "existing").mkdir()
    real_write = tokenizer_train.atomic_write

    def full_at_merges(path, write):
        if path.name == "merges.txt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, write)

    monkeypatch.setattr(tokenizer_train, "atomic_write", full_at_merges)
    with pytest.raises(SystemExit) as stop:
        tokenizer_command.main(["--data", str(data), "--vocab-size", "300", "--out", str(tmp_path / out)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: cannot write --out {tmp_path / out} (No space left on device): free some disk space or choose "
        "another folder; nothing was written")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data.txt", "existing"]
    assert list((tmp_path / "existing").iterdir()) == []
