"""Fuzzing the checkpoint readers: seeded damage to every fixture must load to exactly the expected arrays or raise
CheckpointError naming the damaged file; never another exception, more than a second, or more than a small multiple of
the files' size in memory. The mutations and that rule live in scripts/common/fuzzing/;
scripts/dev/fuzz_formats.py runs more.
"""
import shutil
from collections import Counter

import pytest

from gpt2_numpy.formats import tf_bundle
from tests.conftest import FIXTURES, official_path
from scripts.common.fuzzing.fixtures import DATA, FIXTURES_BY_NAME, FORMATS, INDEX, STATE
from scripts.common.fuzzing.runner import Case, Runner, cases
from scripts.common.fuzzing.tf_index import BYTES, VARINT, fields_of, fields_of_value, proto, set_field, table
from tests.cli.test_generate import assert_one_error_line, cli

CASES_PER_FORMAT = 800  # first a cut at every structural boundary (240 TF, 416 safetensors), then random damage


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    with Runner(tmp_path_factory.mktemp("fuzz")) as runner:
        yield runner


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_damaged_files_load_exactly_or_raise_checkpoint_error(runner, fmt):
    outcomes, failures = Counter(), []
    for case in cases(fmt, CASES_PER_FORMAT, runner):
        outcome, problem = runner.run(case)
        outcomes[outcome] += 1
        failures += [problem] if problem else []
    assert not failures, "\n".join(failures[:20])
    assert outcomes["arrays"] > CASES_PER_FORMAT / 20  # the damage reaches past the checks to loads, not only refusals


# --- The judge itself: it must catch what the fuzzing is for ---


def index_case(runner, edit):  # -> a Case: tf_tiny's index with its records edited
    target = next(t for t in runner.targets["tf"] if (t.fixture.name, t.name) == ("tf_tiny", INDEX))
    return Case(0, target, "test", table(edit(list(target.records))), "edited", False, False)


def point_at_another_tensor(records):  # the second tensor's entry takes the first tensor's offset
    offset = fields_of_value(records[1][1]).get(4, 0)
    records[2] = (records[2][0], proto(set_field(fields_of(records[2][1]), 4, VARINT, offset)))
    return records


def test_the_judge_flags_other_arrays(runner, monkeypatch):
    assert runner.run(index_case(runner, point_at_another_tensor)) == ("error", None)  # refused as overlapping
    monkeypatch.setattr(tf_bundle, "check_disjoint", lambda *args: None)  # the reader before it learned to refuse
    outcome, problem = runner.run(index_case(runner, point_at_another_tensor))
    assert outcome == "arrays" and "with other values or shape" in problem


def test_the_judge_flags_exceptions_other_than_checkpoint_error(runner, monkeypatch):
    def broken(message):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(tf_bundle, "parse_header", broken)
    outcome, problem = runner.run(index_case(runner, lambda records: records))
    assert outcome == "crash" and "raised TypeError: unsupported operand at test_fuzz_formats.py" in problem


@pytest.mark.parametrize("seconds, flagged", [((1.5, 0.01), False), ((1.5, 1.4), True)])
def test_a_load_over_the_time_limit_is_flagged_only_if_it_is_as_slow_again(runner, monkeypatch, seconds, flagged):
    load, times = runner.load, iter(seconds)  # each load of the undamaged index, taking these CPU seconds in turn

    def timed(*args):
        outcome, _, peak = load(*args)
        return outcome, next(times), peak

    monkeypatch.setattr(runner, "load", timed)
    _, problem = runner.run(index_case(runner, lambda records: records))
    assert problem.endswith("took 1.40 s") if flagged else problem is None


@pytest.mark.parametrize("seconds, peak, message, problem", [
    (1.5, 0, None, "took 1.50 s"),
    (0.01, 10**8, None, "allocated 100,000,000 bytes, over"),
    (0.01, 0, "model.ckpt.index: something", "CheckpointError names no damaged file"),  # a name, not the path
    (0.01, 0, "a tensor named 'x\ny'", "not one printable line"),
])
def test_the_judge_flags_slow_greedy_and_anonymous_outcomes(runner, seconds, peak, message, problem):
    case = index_case(runner, lambda records: records)
    kind, value = ("error", message) if message else runner.originals["tf_tiny", False]
    assert problem in runner.judge(case, kind, value, seconds, peak)


def test_the_judge_accepts_a_refusal_that_names_the_data_file_an_index_describes(runner):
    message = f"{runner.folder(FIXTURES_BY_NAME['tf_tiny']) / DATA}: tensor model/wte needs bytes ..."
    assert runner.judge(index_case(runner, lambda records: records), "error", message, 0.01, 0) is None


# --- The command line: a damaged checkpoint is one error line and exit status 2, never a traceback ---


def with_entry_field(number, wire_type, value):  # -> damage: tf_tiny's first tensor entry gets this field
    def damage(folder):
        records = tf_records(folder)
        records[1] = (records[1][0], proto(set_field(fields_of(records[1][1]), number, wire_type, value)))
        (folder / INDEX).write_bytes(table(records))
    return damage


def tf_records(folder):  # -> [(key, value)] of the folder's index
    return list(tf_bundle.table_records((folder / INDEX).read_bytes()))


def with_shard_count(count):
    def damage(folder):
        records = tf_records(folder)
        records[0] = (b"", proto(set_field(fields_of(records[0][1]), 1, VARINT, count)))
        (folder / INDEX).write_bytes(table(records))
    return damage


def with_prefix(prefix):
    return lambda folder: (folder / STATE).write_bytes(b'model_checkpoint_path: "' + prefix + b'"\n')


def nested_hparams(folder):
    (folder / "hparams.json").write_text('{"n_layer": ' + "[" * 100_000 + "]" * 100_000 + "}")


def nested_safetensors_header(folder):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    text = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + int.from_bytes(data[:8], "little") :])


CLI_DAMAGE = {  # id: (fixture, damage, the file the error line must name); each crashed or loaded before issue 15
    "DT_INT32 entry": ("tf_tiny", with_entry_field(1, VARINT, 3), "model.ckpt.index: tensor model/h0/attn/c_attn/b"),
    "dtype as bytes": ("tf_tiny", with_entry_field(1, BYTES, b"\1"), "model.ckpt.index: not a valid"),
    "2**31 data shards": ("tf_tiny", with_shard_count(2**31), "model.ckpt.data-00000-of-2147483648 is missing"),
    "NUL in the prefix": ("tf_tiny", with_prefix(b"model\0.ckpt"), "checkpoint names the checkpoint"),
    "prefix outside": ("tf_tiny", with_prefix(b"../../other/model.ckpt"), "checkpoint names the checkpoint"),
    "hparams nested 100k deep": ("tf_tiny", nested_hparams, "hparams.json is not valid JSON"),
    "header nested 100k deep": ("hf_tiny", nested_safetensors_header, "model.safetensors: the header is not valid"),
}


@pytest.mark.slow
@pytest.mark.parametrize("fixture, damage, fragment", CLI_DAMAGE.values(), ids=CLI_DAMAGE)
def test_a_damaged_checkpoint_is_one_error_line_on_the_command_line(tmp_path, fixture, damage, fragment):
    hf = fixture.startswith("hf")
    folder = tmp_path / "models" / ("124M-hf" if hf else "124M")
    shutil.copytree(FIXTURES / fixture, folder)
    shutil.copytree(FIXTURES / fixture, tmp_path / "other")  # a whole checkpoint outside the model folder
    for name, ours in [("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")]:
        shutil.copy(official_path(f"124M/{name}"), folder / (ours if hf else name))
    damage(folder)
    source = ["--source", "huggingface"] if hf else []
    assert_one_error_line(cli("hi", "--n-tokens", "1", *source, models_dir=folder.parent), fragment)
