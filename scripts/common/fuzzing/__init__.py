"""Seeded random damage to the checkpoint fixtures, and the rule every damaged file must obey.

Each case mutates one file of a fixture (tests/fixtures/tf_tiny, tf_half, hf_tiny, hf_tiny_hub, dtypes.safetensors) and
loads the fixture again: through load_params for model folders, through the format's reader for the others. The load
must either
- return exactly the arrays expected: the original ones, or, when only tensor bytes that no checksum covers changed
  (safetensors; a TF data file read without verify), those tensor bytes as they now are; or
- raise CheckpointError naming the damaged file (an index may also be blamed through the data file it describes),
  unless the mutation only re-encodes the same tensors validly, which must load;
and never raise anything else, take over a second, or allocate more than a small multiple of the files' size.
tests/hostile/test_fuzz_formats.py runs a set number of cases per format, scripts/dev/fuzz_formats.py as many as asked.

fixtures.py: the fixtures and how each loads; tf_index.py: the TF index written and read; mutations.py and
tf_mutations.py: the damage; runner.py: the cases, and the runner that judges each by the rule above.
"""
