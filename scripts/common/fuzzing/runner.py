"""The fuzzing cases (each file of each fixture, its mutations, the cuts at its structural boundaries) and the
runner that loads each damaged fixture and judges the outcome by the rule of this package."""
import json
import random
import shutil
import time
import tracemalloc
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats.tf_bundle import read_handle, read_index, read_varint, table_records
from scripts.common.fuzzing.fixtures import (DATA, FIXTURE_LIST, FIXTURES_BY_NAME, FORMATS, INDEX, STATE, Fixture,
                                             header_of, original_files, payload_arrays, tensor_layout)
from scripts.common.fuzzing.mutations import st_bytes, st_header_edit, st_header_text, st_reencode, st_size_field
from scripts.common.fuzzing.tf_mutations import (raw_bytes, record_starts, state_prefix, tf_block_edit, tf_compression,
                                                 tf_footer, tf_key_edit, tf_record_edit, tf_relayout)

SECONDS_LIMIT = 1.0  # CPU seconds per load: every fixture loads in milliseconds, so this only catches runaway work;
# CPU time, not wall time, which a stalled VM or a busy neighbour stretches. A load over it is timed again, and the
# faster time counts: in two CI runs of the whole suite one load took 1.12 and 1.27 s of CPU where the same cases alone
# take milliseconds, other work charged to it (a garbage collection, the kernel's on a page fault)
MEMORY_FACTOR, MEMORY_SLACK = 4, 2**20  # peak allocation allowed: 4x the files' bytes, plus 1 MiB for small files


# --- Targets: each damageable file, its mutations (weighted), and the boundaries truncations stop at ---


@dataclass
class Target:
    fixture: Fixture
    name: str
    data: bytes
    mutations: list  # [(weight, mutation)]: mutation(rng, target, context) -> (data, description, must load)
    boundaries: list  # byte offsets where a structure starts or ends
    records: tuple = ()  # of an index: its (key, value) records, parsed once


def tf_index_boundaries(data):  # -> offsets of each block, trailer, record, restart array and footer field
    footer_start = len(data) - 48
    bounds, pos = [footer_start, len(data) - 8], footer_start
    handles = []
    for _ in range(2):
        handle, pos = read_handle(data, pos)
        handles.append(handle)
        bounds.append(pos)
    index_block = data[handles[1][0] : sum(handles[1])]
    handles += [read_handle(value, 0)[0] for value in block_values(index_block)]
    for offset, size in handles:
        contents = data[offset : offset + size]
        n_restarts = int.from_bytes(contents[-4:], "little")
        bounds += [offset, offset + size, offset + size + 1, offset + size + 5,
                   offset + size - 4 * (n_restarts + 1), *(offset + start for start in record_starts(contents))]
    return bounds


def block_values(contents):  # -> the values of a block's records
    values = []
    for start in record_starts(contents):
        pos = read_varint(contents, start)[1]
        unshared, pos = read_varint(contents, pos)
        value_size, pos = read_varint(contents, pos)
        values.append(contents[pos + unshared : pos + unshared + value_size])
    return values


def safetensors_boundaries(data):  # -> the size field, each top-level key and separator, each tensor's span
    size, text = header_of(data)
    bounds = list(range(9)) + [8 + size - 1, 8 + size]
    header = json.loads(text)
    for name, spec in header.items():
        start = text.find(json.dumps(name).encode())
        bounds += [8 + start, 8 + start + len(json.dumps(name))]
        if name != "__metadata__":
            bounds += [8 + size + offset for offset in spec["data_offsets"]]
    return bounds


def targets():  # -> {format: [Target]}
    result = {}
    for fmt, names in FORMATS.items():
        result[fmt] = []
        for name in names:
            fixture = FIXTURES_BY_NAME[name]
            files = original_files(fixture)
            for file in fixture.files:
                data = files[file]
                if file == INDEX:
                    mutations = [(3, tf_record_edit), (1, tf_key_edit), (2, tf_block_edit), (1, tf_relayout),
                                 (1, tf_footer), (0.3, tf_compression), (2, raw_bytes)]
                    boundaries = tf_index_boundaries(data)
                elif file == DATA:
                    mutations = [(1, raw_bytes)]
                    boundaries = [0] + [b for entry in read_index(fixture.source / INDEX)[1].values()
                                        for b in (entry.offset, entry.offset + entry.size)]
                elif file == STATE:
                    mutations, boundaries = [(1, raw_bytes), (1, state_prefix)], list(range(len(data)))
                else:
                    mutations = [(3, st_bytes), (1, st_size_field), (2, st_header_text), (4, st_header_edit),
                                 (1, st_reencode)]
                    boundaries = safetensors_boundaries(data)
                cuts = sorted({cut for b in boundaries for cut in (b - 1, b) if 0 <= cut < len(data)})
                records = tuple(table_records(data)) if file == INDEX else ()
                result[fmt].append(Target(fixture, file, data, mutations, cuts, records))
    return result


# --- Cases, and the runner that loads each and judges the outcome ---

# how often each file is damaged, relative to a safetensors file's 1; tf_half's data, 12 bytes behind a DT_HALF
# entry that is refused before any data is read, has little to show
FILE_WEIGHTS = {("tf_tiny", INDEX): 5, ("tf_tiny", DATA): 2, ("tf_tiny", STATE): 1, ("tf_half", INDEX): 2,
                ("tf_half", DATA): 0.2, ("tf_half", STATE): 0.5}


@dataclass
class Case:
    number: int
    target: Target
    mutation: str  # the mutation's function name, or "cut"
    data: bytes
    description: str
    must_load: bool  # a valid re-encoding of the same tensors
    verify: bool


def cases(fmt, n_cases, runner, seed=0):  # -> iterator of Case: a cut at each structural boundary, then random ones
    format_targets = runner.targets[fmt]
    cuts = [(target, cut) for target in format_targets for cut in target.boundaries]
    weights = [FILE_WEIGHTS.get((target.fixture.name, target.name), 1) for target in format_targets]
    for number in range(n_cases):
        rng = random.Random(f"{fmt}/{seed}/{number}")
        verify = rng.random() < 0.5
        if number < len(cuts):
            target, cut = cuts[number]
            mutation, (data, description, must_load) = "cut", (target.data[:cut], f"cut at boundary {cut}", False)
        else:
            target = rng.choices(format_targets, weights)[0]
            mutation_weights, mutations = zip(*target.mutations)
            mutate = rng.choices(mutations, mutation_weights)[0]
            mutation = mutate.__name__
            data, description, must_load = mutate(rng, target, runner.context(target.fixture))
        yield Case(number, target, mutation, data, description, must_load, verify)


def replace(path, data):  # -> None; path holds data in a new file: a mapping of the old one stays valid (no SIGBUS)
    path.unlink()  # rather than os.replace, which ext4 makes flush the new file to disk: 3 ms a case
    path.write_bytes(data)


def same_arrays(actual, expected, by_name):  # -> None, or how {key: array} differs from {key: [arrays allowed]}
    if not by_name:  # only the reader ran: a tensor's name is free-form, and a renamed one is just as valid
        unmatched = list(expected.values())
        for array in actual.values():
            match = next((i for i, allowed in enumerate(unmatched) if any(map(partial(same, array), allowed))), None)
            if match is None:
                return "loaded other tensors"
            unmatched.pop(match)
        return "loaded too few tensors" if unmatched else None
    if actual.keys() != expected.keys():
        return f"loaded the tensors {sorted(map(str, actual.keys() ^ expected.keys()))[:2]} in or out of place"
    for key, allowed in expected.items():
        if not any(same(actual[key], array) for array in allowed):
            return f"loaded tensor {key} with other values or shape"
    return None


def same(a, b):  # -> True for arrays equal to the bit (NaNs too), with one dtype and shape
    return (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes())


class Runner:
    """Scratch copies of every fixture (and, beside them, copies with other data for prefixes that lead out of the
    folder); run(case) damages one file, loads, restores the file and returns None or what went wrong."""

    def __init__(self, workdir):
        self.workdir = Path(workdir).resolve()
        self.targets = targets()
        self.files = {fixture.name: original_files(fixture) for fixture in FIXTURE_LIST}
        self.layouts = {fixture.name: tensor_layout(fixture, self.files[fixture.name]) for fixture in FIXTURE_LIST}
        for fixture in FIXTURE_LIST:
            files = self.files[fixture.name]
            write_folder(self.folder(fixture), files)
            outside = dict(files)
            if DATA in files:  # other weights: a prefix leading out of the folder would load them
                outside[DATA] = flipped(files[DATA])
            write_folder(self.outside(fixture), outside)
        self.originals = {}

    def folder(self, fixture):
        return self.workdir / "cases" / fixture.name

    def outside(self, fixture):
        return self.workdir / "outside" / fixture.name

    def context(self, fixture):  # -> what mutations may refer to: the case folder, and another checkpoint outside it
        return {"folder": self.folder(fixture), "outside": self.outside(fixture)}

    def __enter__(self):
        tracemalloc.start()
        for fixture in FIXTURE_LIST:  # also warms the CRC32C tables, so no case pays for them
            for verify in (False, True):
                kind, value = self.load(fixture, verify)[0]
                self.originals[fixture.name, verify] = (kind, {key: np.array(a) for key, a in value.items()}
                                                         if kind == "arrays" else value)
        return self

    def __exit__(self, *exc_info):
        tracemalloc.stop()

    def load(self, fixture, verify):  # -> ((kind, arrays or message), seconds, peak bytes allocated)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        start = time.thread_time()  # the loaders run on this thread alone
        try:
            outcome = ("arrays", fixture.load(self.folder(fixture), verify))
        except CheckpointError as error:
            outcome = ("error", str(error))
        except Exception as error:  # anything else is a finding: say what and where
            where = traceback.extract_tb(error.__traceback__)[-1]
            outcome = ("crash", f"{type(error).__name__}: {str(error)[:200]} at {Path(where.filename).name}:"
                                f"{where.lineno}")
        seconds = time.thread_time() - start
        return outcome, seconds, tracemalloc.get_traced_memory()[1] - before

    def run(self, case):  # -> (outcome: "arrays", "error" or "crash"; None, or a line saying what went wrong)
        fixture, name = case.target.fixture, case.target.name
        path = self.folder(fixture) / name
        replace(path, case.data)
        try:
            (kind, value), seconds, peak = self.load(fixture, case.verify)
            if seconds > SECONDS_LIMIT:  # runaway work is as slow the second time; a one-off stall is not
                seconds = min(seconds, self.load(fixture, case.verify)[1])
            problem = self.judge(case, kind, value, seconds, peak)
        finally:
            replace(path, self.files[fixture.name][name])
        if problem:
            problem = f"case {case.number}: {fixture.name}/{name} {case.description} (verify={case.verify}): {problem}"
        return kind, problem

    def judge(self, case, kind, value, seconds, peak):  # -> None, or what is wrong with the outcome
        fixture = case.target.fixture
        files_size = sum(map(len, self.files[fixture.name].values())) - len(case.target.data) + len(case.data)
        budget = MEMORY_FACTOR * files_size + MEMORY_SLACK
        if kind == "crash":
            return f"raised {value}"
        if seconds > SECONDS_LIMIT:
            return f"took {seconds:.2f} s"
        if peak > budget:
            return f"allocated {peak:,} bytes, over {budget:,}"
        if kind == "arrays":
            expected = self.expected_arrays(case)
            if expected is None:
                return "loaded, but these files cannot load"
            return same_arrays(value, expected, fixture.checks_names)
        if not value.isprintable():  # the command line prints it as one "error:" line
            return f"CheckpointError message is not one printable line: {value!r:.300}"
        if value == self.originals[fixture.name, case.verify][1]:
            return None  # the undamaged fixture fails the same way (tf_half: DT_HALF)
        if case.must_load:
            return f"refused a valid file: {value}"
        blamed = [case.target.name] + [DATA] * (case.target.name == INDEX)  # an index describes its data file
        if any(str(self.folder(fixture) / name) in value for name in blamed):
            return None
        return f"CheckpointError names no damaged file: {value[:300]}"

    def expected_arrays(self, case):  # -> {key: array} the damaged files must load to, or None if they cannot
        fixture = case.target.fixture
        kind, original = self.originals[fixture.name, case.verify]
        if kind != "arrays":
            return None
        if case.target.name == fixture.payload and not (fixture.checksummed and case.verify):
            return payload_arrays(fixture, self.layouts[fixture.name], case.data)  # tensor bytes no checksum covers
        return {key: [array] for key, array in original.items()}


def write_folder(folder, files):  # -> None; folder holds exactly files ({name: bytes})
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def flipped(data):  # -> data with its middle byte inverted: inside a tensor, so it loads as other weights
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
