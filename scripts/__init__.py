"""Scripts around gpt2_numpy, never imported by it. Run each from the repo root as a module, so that this checkout's
gpt2_numpy and scripts are the ones imported: `python -m scripts.benchmark --only prefill`.

- benchmark.py: the speed goals, a table of our numbers beside Hugging Face's (`--compare-hf`); bench/ holds its parts.
- fixtures/: the make_* scripts that write tests/fixtures from reference implementations (HF, torch, TensorFlow).
- demo/: the Shakespeare model of the docs, its loss curve and the explain page's screenshot.
- dev/: tools for developing: mutants, the format fuzzer, two model.py versions side by side, the HF check of a
  trained folder.
- common/: what both tests and scripts use: the text samples and the fuzzing library.
"""
