"""docs/sae.md's worked example of a released SAE, run against a loopback hub: a server on 127.0.0.1 serves the fake
files of tests/fixtures/sae_releases/ where the hub keeps gpt2-small-res-jb's, HF_ENDPOINT points at it, and the
commands run on that fixture's random 2-block GPT-2 (the numbers are a random SAE's on a random model: the example
shows what the commands print, not what the real release scores). Prints each command, then its stdout.

    python -m scripts.sae.loopback_example
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELEASE = "gpt2-small-res-jb/blocks.1.hook_resid_pre"
TEXT = "The cat sat on the mat, and the dog sat on the rug."
COMMANDS = (("sae", "eval", "--sae", RELEASE, "--model", "MODEL", "--data", "TEXT", "--seq-len", "8", "--windows", "4"),
            ("explain", "The cat sat", "--model", "MODEL", "--sae", RELEASE))


def outputs(folder):  # -> [(command line as the page shows it, its stdout)], run in folder with the hub up
    sys.path.insert(0, str(REPO))
    from tests.http_server import FileServer
    from tests.sae_release_helpers import RELEASE_FIXTURES, hub_layout

    (folder / "text.txt").write_text(TEXT)
    files, published = hub_layout()
    runs = []
    with FileServer(files, published=published) as server:
        env = {**os.environ, "HF_ENDPOINT": server.url, "GPT2_NUMPY_WEIGHTS": str(folder / "weights"),
               "PYTHONPATH": str(REPO)}
        for command in COMMANDS:
            argv = [{"MODEL": str(RELEASE_FIXTURES / "model"), "TEXT": "text.txt"}.get(part, part) for part in command]
            result = subprocess.run([sys.executable, "-m", f"gpt2_numpy.{argv[0]}", *argv[1:]], cwd=folder, env=env,
                                    capture_output=True, text=True, timeout=300, check=True)
            shown = " ".join(f'"{part}"' if " " in part else part for part in command)
            runs.append((f"gpt2-numpy {shown}", result.stdout))
    return runs


def main():
    with tempfile.TemporaryDirectory() as folder:
        for command, stdout in outputs(Path(folder)):
            print(f"$ {command}\n{stdout}")


if __name__ == "__main__":
    main()
