"""Write tests/fixtures/dtypes.safetensors with the real safetensors library and torch, to test our F16/BF16 reading.

The same float32 values (random ones, plus zeros, infinities, NaN, extremes and subnormals) are stored as "f32",
"f16" and "bf16", and torch's own conversions back to float32 as "f16_as_f32" and "bf16_as_f32": our reader's
conversion of "f16"/"bf16" must match torch's exactly.

Rerun (reference tools live in a venv outside the repo; they are never runtime dependencies), from the repo root:
    python3 -m venv ../refvenv && ../refvenv/bin/pip install torch safetensors
    ../refvenv/bin/python scripts/make_safetensors_fixture.py
"""
import argparse
import math
import sys
from pathlib import Path

try:  # the tools live in a venv of their own: without them, --help still works and a run says what to install
    import numpy as np
    import torch
    from safetensors.torch import save_file
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]  # the package to install, not its submodule
else:
    MISSING = None

SETUP = (
    "run this script in a venv with torch and safetensors, made from the repo root with: python3 -m venv ../refvenv "
    "&& ../refvenv/bin/pip install torch safetensors && ../refvenv/bin/python scripts/make_safetensors_fixture.py"
)
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "dtypes.safetensors"
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -2.5, 65504.0, 1e5, 6e-8, 1e-40, -3.4e38]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()  # no options: --help, and a refusal of anything else
    if MISSING:
        sys.exit(f"error: {MISSING} is missing from {sys.executable}: {SETUP}")
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(48, dtype=np.float32) * 10, np.array(SPECIAL, np.float32)])
    f32 = torch.from_numpy(values.reshape(4, 15))
    f16, bf16 = f32.to(torch.float16), f32.to(torch.bfloat16)
    save_file({"f32": f32, "f16": f16, "bf16": bf16, "f16_as_f32": f16.float(), "bf16_as_f32": bf16.float()}, str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
