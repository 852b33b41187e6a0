"""The weights loader's public path: it lives in gpt2_numpy/formats/checkpoint.py, beside the file formats it reads."""
from gpt2_numpy.formats.checkpoint import load_params, verify_checkpoint  # noqa: F401 (the public names)
