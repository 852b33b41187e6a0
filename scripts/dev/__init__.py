"""Tools for developing gpt2_numpy: mutants, the format fuzzer, model.py versions compared, the HF check of a folder."""
