"""A cross-platform lock on an open file, taken by downloads (loading.locked) and training runs (runs.claimed) alike:
flock where there is fcntl (POSIX), else msvcrt's byte lock (Windows). Both end with their process, so a crash never
leaves a stale lock. With neither (no such platform runs NumPy today), importing still works and the work goes on
unlocked, saying so."""
import os
import time
from contextlib import suppress

from gpt2_numpy.console import log

try:
    import fcntl

    msvcrt = None
except ImportError:
    fcntl = None
    try:
        import msvcrt
    except ImportError:
        msvcrt = None

LOCK_POLL_SECONDS = 1.0  # a waiting process asks for the lock this often (msvcrt cannot wait without a time limit)


def take_lock(lock, folder, what="download", wait=True):  # -> True once this process holds the lock on the open file
    # `lock`; False at once, when another process holds it, if not told to wait. what: the work the lock guards
    if not (fcntl or msvcrt):
        log(f"note: this system has no file locks (neither fcntl nor msvcrt): run one {what} into {folder} at a time")
    elif not try_lock(lock):
        if not wait:
            return False
        log(f"another {what} into {folder} is in progress; waiting for it to finish")
        while not try_lock(lock):
            time.sleep(LOCK_POLL_SECONDS)
    return True


def try_lock(lock):  # -> True when this process now holds the lock, False while another process holds it
    try:
        if fcntl:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            lock.seek(0)  # msvcrt locks bytes from the current position: every process locks byte 0
            msvcrt.locking(lock.fileno(), msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):  # flock's EWOULDBLOCK, msvcrt's EACCES: held by another process
        return False
    return True


def release_lock(lock):  # -> None; flock ends when the file closes, but Windows releases msvcrt's lock only eventually
    if msvcrt and not fcntl:
        lock.seek(0)
        msvcrt.locking(lock.fileno(), msvcrt.LK_UNLCK, 1)


def open_lock(path, made):  # -> the lock file at path, open and locked by this process (made, with its folders)
    # A holder whose work left nothing behind deletes the file (and the folders it made) on its way out (see
    # loading.locked).
    # Whoever waited on that file then holds a lock that no one else can see, so it takes the lock again on the file
    # now under that name, and counts the folders it has to make again as made by itself (made: made_folders' list)
    folder = path.parent
    while True:
        made += [above for above in (folder, *folder.parents) if not above.exists() and above not in made]
        folder.mkdir(parents=True, exist_ok=True)
        try:
            lock = path.open("a")
        except FileNotFoundError:  # the folder went between the two calls: make it again
            continue
        take_lock(lock, folder)
        with suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(lock.fileno()), os.stat(path)):
                return lock
        lock.close()


def only_the_lock(path):  # -> True when the lock file at path is the only thing in its folder
    try:
        return [entry.name for entry in path.parent.iterdir()] == [path.name]
    except OSError:
        return False
