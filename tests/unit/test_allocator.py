"""keep_freed_memory: a forward pass's freed arrays are reused without page faults, and every CLI asks for it;
scratch() keeps a pass's largest arrays from then on."""
import platform
import subprocess
import sys
import threading
from argparse import Namespace

import numpy as np
import pytest

from gpt2_numpy import allocator
from gpt2_numpy.commands import common as cli
from tests.conftest import REPO, tiny_models_dir

# The minor page faults of allocating and freeing the large arrays of a forward pass, in a fresh interpreter that
# calls keep_freed_memory first (as the CLIs do, before their first pass) or not at all; argv[1] says which
FAULTS = """
import resource, sys
from gpt2_numpy.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
import numpy as np

def faults_of_a_pass():
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):  # an ffn activation [1024, 3072], a block of attention scores [12, 128, 1024], a product
        activation, scores = np.ones((1024, 3072), np.float32), np.ones((12, 128, 1024), np.float32)
        product = activation * 2
        del activation, scores, product
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

faults_of_a_pass()  # the first pass grows the heap
print(kept, faults_of_a_pass())
"""


def faults_of_a_pass(how):  # -> (what keep_freed_memory returned, or "None"; page faults of the second pass)
    result = subprocess.run([sys.executable, "-c", FAULTS, how], capture_output=True, text=True, cwd=REPO, check=True)
    kept, faults = result.stdout.split()
    return kept, int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's M_MMAP_THRESHOLD and M_TOP_PAD are glibc's")
def test_freed_arrays_are_reused_without_page_faults():
    assert faults_of_a_pass("default")[1] > 5000  # glibc gives the memory back, and each pass faults in ~7,600 pages
    assert faults_of_a_pass("keep") == ("True", 0)


def test_every_cli_keeps_freed_memory_before_its_forward_passes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append("kept"))
    models_dir = tiny_models_dir(tmp_path)
    cli.model_from_args(Namespace(model="124M", models_dir=str(models_dir), source="openai"))
    assert calls == ["kept"]


class FakeLibc:  # a C library whose mallopt takes only the options in `accepted`, as musl's takes none
    def __init__(self, accepted):
        self.accepted, self.options = accepted, []

    def mallopt(self, option, value):
        self.options.append(option)
        return int(option in self.accepted)


def no_c_library(name):
    raise OSError("no such library")


@pytest.mark.parametrize("accepted, kept", [({-2, -3}, True), ({-3}, False), (set(), False)])
def test_true_only_when_the_c_library_takes_both_options(monkeypatch, accepted, kept):
    monkeypatch.setitem(allocator.keeping, "on", False)  # as it was, after the test
    libc = FakeLibc(accepted)  # glibc's malloc.h: M_TOP_PAD is -2, M_MMAP_THRESHOLD -3
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: libc)
    assert allocator.keep_freed_memory() is kept
    if kept:
        assert sorted(libc.options) == [-3, -2]


@pytest.mark.parametrize("cdll", [lambda name: object(), no_c_library])  # macOS: no mallopt; no C library at all
def test_false_without_mallopt(monkeypatch, cdll):
    monkeypatch.setitem(allocator.keeping, "on", False)
    monkeypatch.setattr(allocator.ctypes, "CDLL", cdll)
    assert allocator.keep_freed_memory() is False


def test_scratch_gives_new_arrays_until_freed_memory_is_kept(monkeypatch):
    monkeypatch.setitem(allocator.keeping, "on", False)
    monkeypatch.setattr(allocator, "scratches", threading.local())
    first = allocator.scratch("logits", (3, 4), np.float32)
    assert first.shape == (3, 4) and first.dtype == np.float32
    assert not np.shares_memory(first, allocator.scratch("logits", (3, 4), np.float32))
    monkeypatch.setattr(allocator.ctypes, "CDLL", no_c_library)  # kept even where glibc's part cannot be
    allocator.keep_freed_memory()
    assert allocator.scratch("logits", (3, 4), np.float32) is allocator.scratch("logits", (3, 4), np.float32)


def test_kept_scratch_is_one_array_per_name_shape_dtype_and_thread(monkeypatch):
    monkeypatch.setitem(allocator.keeping, "on", True)
    monkeypatch.setattr(allocator, "scratches", threading.local())
    kept = allocator.scratch("logits", (3, 4), np.float32)
    assert allocator.scratch("logits", (3, 4), np.float32) is kept
    assert not np.shares_memory(allocator.scratch("d_wte", (3, 4), np.float32), kept)
    for shape, dtype in (((4, 3), np.float32), ((4, 3), np.float64)):
        again = allocator.scratch("logits", shape, dtype)
        assert again.shape == shape and again.dtype == dtype
    on_another_thread = []
    thread = threading.Thread(target=lambda: on_another_thread.append(allocator.scratch("logits", (4, 3), np.float64)))
    thread.start()
    thread.join()
    assert not np.shares_memory(on_another_thread[0], allocator.scratch("logits", (4, 3), np.float64))


def test_kept_scratch_keeps_arrays_on_its_thread_until_released(monkeypatch):
    # train_step's block: kept without keep_freed_memory(), on this thread only, and only within the block (a nested
    # one ending leaves the outer one keeping)
    monkeypatch.setitem(allocator.keeping, "on", False)
    monkeypatch.setattr(allocator, "scratches", threading.local())
    monkeypatch.setattr(allocator, "holding", threading.local())
    with allocator.kept_scratch():
        with allocator.kept_scratch():
            kept = allocator.scratch("logits", (3, 4), np.float32)
        assert allocator.scratch("logits", (3, 4), np.float32) is kept
        elsewhere = []
        thread = threading.Thread(target=lambda: elsewhere.extend(allocator.scratch("logits", (3, 4), np.float32)
                                                                  for _ in range(2)))
        thread.start()
        thread.join()
        assert not np.shares_memory(*elsewhere)  # another thread's scratch: new arrays, not kept
    assert not np.shares_memory(allocator.scratch("logits", (3, 4), np.float32), kept)  # outside: new arrays
    assert vars(allocator.scratches).keys() == {"logits"}  # ... while the kept one stays
    allocator.release_scratch()
    assert not vars(allocator.scratches)
    with allocator.kept_scratch():
        assert not np.shares_memory(allocator.scratch("logits", (3, 4), np.float32), kept)


def test_loss_and_grads_alone_keeps_nothing(monkeypatch):
    # only train_step's loop keeps its arrays: a single gradient (explain, a gradient check) frees its 200 MB of
    # logits when it returns
    from gpt2_numpy import fast_backward
    from gpt2_numpy.params import random_params
    monkeypatch.setitem(allocator.keeping, "on", False)
    monkeypatch.setattr(allocator, "scratches", threading.local())
    hparams = {"n_vocab": 11, "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 1}
    ids = np.random.default_rng(0).integers(0, 11, (2, 8))
    fast_backward.loss_and_grads(ids, ids, random_params(hparams, seed=0), 2)
    assert not vars(allocator.scratches)
