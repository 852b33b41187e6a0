"""torch.save's files (.pt, the zip layout of torch >= 1.6) read without torch and without running pickled code.

Layout: a zip archive whose one top folder holds data.pkl (a pickle of the saved object), data/<key> (each storage's
raw bytes, little-endian as byteorder says) and version. The pickle names the functions that rebuild its objects; a
reader that calls what it names runs any code the file's author chose. Here the unpickler knows a few names only: a
dict (OrderedDict), torch's _rebuild_tensor_v2 and _rebuild_parameter, and the storage types, each of which it builds
itself from the storage's bytes. Any other name (a class, a function, an SAE module) refuses the file in one line.

    tensors = read_torch_zip(path)  # {name: SafeTensor}, as formats/safetensors.py's read_safetensors returns them
"""
import collections
import pickle
import zipfile

import numpy as np

from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import shown
from gpt2_numpy.formats.safetensors import SafeTensor

STORAGES = {"FloatStorage": ("F32", "<f4"), "DoubleStorage": ("F64", "<f8"), "HalfStorage": ("F16", "<f2"),
            "BFloat16Storage": ("BF16", "<u2")}  # the dtypes an SAE's weights come in: other storages are refused
LIMIT = 2**34  # 16 GiB: no storage of a GPT-2 SAE comes near it; a damaged size field cannot ask for more


class Storage:
    def __init__(self, kind, data):
        self.kind, self.data = kind, data  # kind: (safetensors dtype, NumPy dtype); data: uint8 bytes


class Unpickler(pickle.Unpickler):
    """data.pkl's objects, built from the names above only."""

    def __init__(self, file, archive, folder, path):
        super().__init__(file)
        self.archive, self.folder, self.path = archive, folder, path

    def find_class(self, module, name):  # -> what a name in the pickle stands for; CheckpointError for others
        allowed = {("collections", "OrderedDict"): collections.OrderedDict,
                   ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
                   ("torch._utils", "_rebuild_parameter"): rebuild_parameter}
        if (module, name) in allowed:
            return allowed[module, name]
        if module == "torch" and name in STORAGES:
            return STORAGES[name]
        raise CheckpointError(f"{self.path}: its pickle names {shown(f'{module}.{name}')}, which this reader does "
                              "not run (it builds only dicts of float tensors, never pickled code): save the "
                              "weights as safetensors, or as a dict of tensors", files=(self.path,))

    def persistent_load(self, pid):  # ("storage", kind, key, location, numel) -> Storage: data/<key>'s bytes
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in STORAGES.values()):
            raise CheckpointError(f"{self.path}: a storage of {shown(repr(pid)[:80])} is not a float tensor's: only "
                                  "float32, float64, float16 and bfloat16 weights load", files=(self.path,))
        kind, key, numel = pid[1], str(pid[2]), pid[4]
        try:
            info = self.archive.getinfo(f"{self.folder}/data/{key}")
        except KeyError:
            raise CheckpointError(f"{self.path}: the storage data/{shown(key)} is missing from the archive "
                                  "(truncated?)", files=(self.path,)) from None
        size = np.dtype(kind[1]).itemsize
        if info.file_size > LIMIT or info.file_size < numel * size:
            raise CheckpointError(f"{self.path}: data/{shown(key)} holds {info.file_size:,} bytes, not the "
                                  f"{numel * size:,} its {numel:,} numbers take", files=(self.path,))
        return Storage(kind, np.frombuffer(self.archive.read(info), np.uint8))


def rebuild_tensor(storage, offset, size, stride, *_):  # -> SafeTensor: the view of storage torch's tensor is
    kind, itemsize = storage.kind, np.dtype(storage.kind[1]).itemsize
    values = storage.data.view(kind[1])
    if any(not isinstance(n, int) or n < 0 for n in (offset, *size, *stride)) or len(size) != len(stride):
        raise ValueError(f"a tensor's size {list(size)} and stride {list(stride)} are not counts")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else -1  # its last number's index
    if last >= len(values):
        raise ValueError(f"a tensor of size {list(size)} at {offset} runs past its storage of {len(values)} numbers")
    array = np.lib.stride_tricks.as_strided(values[offset:], tuple(size), tuple(s * itemsize for s in stride))
    return SafeTensor(kind[0], tuple(size), np.ascontiguousarray(array).view(np.uint8).reshape(-1))


def rebuild_parameter(data, *_):  # -> the parameter's tensor
    return data


def read_torch_zip(path):  # -> {name: SafeTensor} of a .pt file holding a dict of float tensors; CheckpointError else
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
            if len(pickles) != 1:
                raise CheckpointError(f"{path}: not torch.save's zip layout (no single <folder>/data.pkl): an older "
                                      "torch.save file, or not one; save it again with torch >= 1.6",
                                      files=(path,))
            folder = pickles[0].split("/")[0]
            order = archive.read(f"{folder}/byteorder").decode() if f"{folder}/byteorder" in archive.namelist() \
                else "little"
            if order != "little":
                raise CheckpointError(f"{path}: its tensors are {shown(order)}-endian: only little-endian files load",
                                      files=(path,))
            with archive.open(pickles[0]) as file:
                loaded = Unpickler(file, archive, folder, path).load()
    except (zipfile.BadZipFile, EOFError, pickle.UnpicklingError, ValueError, TypeError, IndexError) as error:
        raise CheckpointError(f"{path}: cannot be read as a torch .pt file ({shown(str(error)[:100])}): download "
                              "it again", files=(path,)) from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})", files=(path,)) from None
    if not isinstance(loaded, dict) or not all(isinstance(value, SafeTensor) for value in loaded.values()):
        raise CheckpointError(f"{path}: holds {type(loaded).__name__}, not a dict of tensors: save the SAE's "
                              "state_dict()", files=(path,))
    return {str(name): value for name, value in loaded.items()}
