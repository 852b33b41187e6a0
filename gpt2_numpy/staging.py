"""Downloads staged until verified: the missing files are fetched (gpt2_numpy/fetch.py, whose network stack loads only
then; it checks each file against a SHA-256 the server publishes, as the Hugging Face hub does for model.safetensors)
into <folder>/.download/, verified there together with second names (hard links) of the files already present, and
only then moved into the folder, so that no final name ever holds unverified downloaded bytes. A bad download is
deleted; good ones stay staged for the next run, and are never deleted because a file of the user's disagrees with
them."""
import os
import shutil
from contextlib import suppress

from gpt2_numpy.catalog import SOURCES
from gpt2_numpy.console import log
from gpt2_numpy.marker import stamps
from gpt2_numpy.verification import verify

STAGING = ".download"  # subfolder holding downloads until they are verified


def download_and_install(folder, size, source, missing):  # -> stamps of the files verified, now all in folder
    # the network stack (requests, tqdm) loads only here: the commands that need no download start without it
    from gpt2_numpy.fetch import fetch_all

    files = SOURCES[source].files
    present = [name for name in files if name not in missing]
    staging = folder / STAGING
    staging.mkdir(exist_ok=True)
    try:
        fetch_all(folder, staging, size, source, missing)
        for name in present:  # the whole model in one folder to verify, while the user's files stay where they are
            second_name(folder / name, staging / name)
        verified = {**stamps(folder, present), **stamps(staging, missing)}  # a rename keeps a stamp
        log("verifying checksums and vocabulary")
        verify(staging, folder, SOURCES[source], fetched=missing)
        for name in missing:
            os.replace(staging / name, folder / name)
        shutil.rmtree(staging)
    finally:
        for name in present:
            with suppress(FileNotFoundError):
                (staging / name).unlink()  # only the second name: the user's file keeps its own
        with suppress(OSError):  # after a failure, keep staging only when it holds files a rerun can reuse
            staging.rmdir()
    return verified


def second_name(path, link):  # -> None: link holds path's bytes too; path itself is neither moved nor changed
    with suppress(FileNotFoundError):
        link.unlink()  # left by a killed run, or a download that the user's own copy of the file has replaced
    try:
        os.link(path, link)  # no byte is copied
    except OSError:  # a file system without hard links (FAT, some network shares): a copy, slower but as safe
        shutil.copyfile(path, link)
