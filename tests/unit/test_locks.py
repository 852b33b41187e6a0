"""gpt2_numpy/locks.py, as a download takes it: a second holder waits, and a waiter whose lock file was deleted locks
the file now in its place."""
import importlib
import sys
import threading


from gpt2_numpy import loading, locks
from gpt2_numpy.loading import DOWNLOAD_LOCK
from tests.download_helpers import (
    WAIT_SECONDS, wait_until,
)
from tests.download_helpers import fast_and_isolated  # noqa: F401 (an autouse fixture)


def test_the_windows_lock_makes_a_second_holder_wait_for_the_first(tmp_path, monkeypatch, capsys):
    msvcrt = importlib.import_module("msvcrt" if sys.platform == "win32" else "tests.fake_msvcrt")
    monkeypatch.setattr(locks, "fcntl", None)
    monkeypatch.setattr(locks, "msvcrt", msvcrt)
    monkeypatch.setattr(locks, "LOCK_POLL_SECONDS", 0.01)
    folder = tmp_path / "124M"
    events, stderr = [], []

    def second_holder():
        with loading.locked(folder):
            events.append("the second holds the lock")

    with loading.locked(folder):
        second = threading.Thread(target=second_holder)
        second.start()
        wait_until(lambda: stderr.append(capsys.readouterr().err) or "in progress" in "".join(stderr))
        events.append("the first lets go")
    second.join(WAIT_SECONDS)
    assert events == ["the first lets go", "the second holds the lock"]


def test_a_waiter_whose_lock_file_was_deleted_locks_the_file_now_in_its_place(tmp_path, capsys):
    # the first holder made the folder and leaves nothing behind, so it deletes the lock file (and the folders) while
    # the second waits on that file: holding it, the second would shut out no one
    folder, checked, stderr = tmp_path / "models" / "124M", [], []

    def second_holder():
        with loading.locked(folder):
            with (folder / DOWNLOAD_LOCK).open("a") as third:  # another process's try, as the second holds the lock
                checked.append(locks.take_lock(third, folder, wait=False))

    with loading.locked(folder):
        second = threading.Thread(target=second_holder)
        second.start()
        wait_until(lambda: stderr.append(capsys.readouterr().err) or "in progress" in "".join(stderr))
    second.join(WAIT_SECONDS)
    assert checked == [False]
    # the second made the folders again, and leaving nothing but its lock there, it removes them as the first did
    assert list(tmp_path.iterdir()) == []
