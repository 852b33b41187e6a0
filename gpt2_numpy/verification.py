"""Verifying a model folder, and blaming the file at fault: the CRC32C of every tensor (TF) or the whole safetensors
structure, every shape against the hyperparameters, and vocabulary files that load and cover every token of the model.
A bad download is deleted, so that the next run fetches a fresh copy; a file of the user's is named and left as it
is."""
from contextlib import contextmanager
from pathlib import Path

from gpt2_numpy.errors import CheckpointError, DownloadError, Interrupted, TokenizerError
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.formats.vocabulary import check_model_vocabulary, read_encoder, read_merges


def verify(model_dir, folder, source, fetched):  # -> None, or raises once each bad download is deleted
    try:
        check_model(model_dir, source)
    except (CheckpointError, TokenizerError) as error:
        compared = [Path(path).name for path in error.files if Path(path).name in source.files]
        blamed = blame(compared, fetched)
        deleted = [name for name in blamed if name in fetched]
        for name in deleted:  # a bad download goes; the good ones stay staged for the next run to reuse
            (model_dir / name).unlink()
        raise failed_verification(error, model_dir, folder, blamed, deleted, compared, fetched) from None
    except KeyboardInterrupt:
        raise Interrupted(f"stopped verifying the files of {folder}; none was moved, changed or deleted: run again "
                          "to verify them") from None


def blame(compared, fetched):  # -> names of the files to blame, from those a failed check compared (at fault first)
    # A download comes whole from the source (checked against a published hash where there is one): when the check
    # held it against a file of the user's, the user's file is blamed, and deleting the download would only fetch the
    # same bytes again. Downloads alone: the one at fault goes, so the next run fetches a fresh copy.
    users = [name for name in compared if name not in fetched]
    if compared and compared[0] in users:
        return compared[:1]
    return users or compared[:1]  # no file compared (an error about the folder): nothing is blamed or deleted


def check_model(model_dir, source):  # -> None, or CheckpointError / TokenizerError whose .files say what was compared
    hparams, _ = load_params(model_dir, verify=True)
    vocab, merges = (model_dir / name for name in source.vocabulary)
    with comparing(vocab):
        encoder = read_encoder(vocab)
    with comparing(merges, vocab):  # the merges must build exactly the tokens of the vocabulary
        read_merges(merges, encoder)
    check_model_vocabulary(len(encoder), hparams["n_vocab"], vocab, files=(vocab, model_dir / source.hparams))


@contextmanager
def comparing(*paths):  # a TokenizerError inside names the files its check compared, the one at fault first
    try:
        yield
    except TokenizerError as error:
        raise TokenizerError(str(error), files=paths) from None


def failed_verification(error, model_dir, folder, blamed, deleted, compared, fetched):  # -> the error to raise
    detail = str(error).replace(str(model_dir), str(folder))  # name files where the user will look for them
    kept = [name for name in blamed if name not in deleted]
    fates = []
    if deleted:
        fates.append(f"deleted the downloaded {', '.join(deleted)}, so the next run fetches a fresh copy")
    if kept:
        against = [name for name in compared if name in fetched]
        fit = f" (it does not fit the downloaded {', '.join(against)}, kept for the next run)" if against else ""
        fates.append(f"left {', '.join(kept)} in {folder} untouched{fit}: replace the bad file with a good copy, or "
                     "delete it so the next run downloads one")
    # a bad download is a failed download (exit 1); a bad file of the user's is bad input, as the loaders say (exit 2)
    return (DownloadError if deleted else type(error))("; ".join([detail, *fates]))
