"""A stand-in for Windows' msvcrt module, built on flock, so that the Windows lock path runs in tests on Linux.

Like the real msvcrt.locking: LK_NBLCK fails at once with OSError(EACCES) while another open file holds the lock, and
LK_UNLCK releases it. Unlike it, LK_LOCK waits without a limit (the real one gives up after 10 tries, 1 s apart) and the
lock covers the whole file rather than the bytes from the current position. `calls` records (mode, nbytes).
"""
import errno
import fcntl

LK_UNLCK, LK_LOCK, LK_NBLCK = 0, 1, 2  # the values of Windows' _LK_UNLCK, _LK_LOCK, _LK_NBLCK
calls = []


def locking(fd, mode, nbytes):
    calls.append((mode, nbytes))
    if mode == LK_UNLCK:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if mode == LK_NBLCK else 0))
    except BlockingIOError:
        raise OSError(errno.EACCES, "Permission denied") from None
