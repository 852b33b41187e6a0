"""The verified marker: <folder>/.verified.json records every file's size, modification time and inode once the files
are verified, so that runs after the first compare those, as git's index does, instead of re-reading gigabytes. A file
rewritten in place (a new time) or a folder copied elsewhere (new inodes) is verified again; delete the marker to
force it."""
import json

from gpt2_numpy.formats import SETTINGS_LIMIT, parse_json, read_regular
from gpt2_numpy.disk import atomic_write

MARKER = ".verified.json"  # {file name: [size, mtime_ns, inode]} of a verified folder, taken before verifying


def is_complete(folder, files):  # -> True when a past run verified these files and none has changed since
    try:
        marker = folder / MARKER
        recorded = parse_json(read_regular(marker, SETTINGS_LIMIT))  # a named pipe or deep JSON: False, not a hang
        written = marker.stat().st_mtime_ns
        # A file whose time is not older than the marker may have changed within the same tick of the file-system
        # clock (a few ms; 2 s on FAT) after it was verified: it is verified again, as git treats "racily clean" files.
        return all(recorded[name] == stamp(folder / name) and recorded[name][1] < written for name in files)
    except (OSError, ValueError, KeyError, TypeError):  # no marker, a damaged or older one, or a file gone
        return False


def stamp(path):  # -> [size, mtime_ns, inode]: a rewrite changes the time, a copy the inode (and usually the time)
    status = path.stat()
    return [status.st_size, status.st_mtime_ns, status.st_ino]


def stamps(folder, names):  # -> {name: stamp} of files in folder
    return {name: stamp(folder / name) for name in names}


def record(folder, verified):  # -> None: the marker, written whole or not at all
    atomic_write(folder / MARKER, lambda file: file.write(json.dumps(verified).encode()))
