"""Writes gpt2_numpy/data/sae_releases.json: SAELens's pretrained SAEs for GPT-2 small, from the pretrained_saes.yaml
that the sae-lens package ships (sae_lens/pretrained_saes.yaml), as gpt2_numpy/sae/releases.py reads them.

    pip download --no-deps sae-lens -d /tmp/sl && unzip -q /tmp/sl/sae_lens-*.whl -d /tmp/sl/src
    python scripts/sae/make_releases.py /tmp/sl/src/sae_lens/pretrained_saes.yaml

Each release keeps what SAELens's SAE.from_pretrained reads of it: the hub repo, the conversion (its loader, when not
SAELens's own folder layout), config_overrides, and per id the path in the repo, the Neuronpedia id, the
norm_scaling_factor, and the published L0 and variance explained (absent where the list gives none: SAELens's own
defaults of 0 and 1 are no measurements).
"""
import argparse
import json
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[2] / "gpt2_numpy" / "data" / "sae_releases.json"
PER_ID = ("path", "neuronpedia", "norm_scaling_factor", "l0", "variance_explained")


def releases(listing, model="gpt2-small"):  # -> {release: entry} of one model's releases, in the list's order
    return {name: entry(value) for name, value in listing.items() if value.get("model") == model}


def entry(value):  # -> one release as the table holds it
    return {"repo": value["repo_id"], "conversion": value.get("conversion_func"),
            "config_overrides": value.get("config_overrides") or {}, "links": value.get("links") or {},
            "saes": {sae["id"]: {name: str(sae[name]) if name == "path" else sae[name]
                                 for name in PER_ID if sae.get(name) is not None} for sae in value["saes"]}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("yaml", type=Path, help="sae_lens/pretrained_saes.yaml")
    parser.add_argument("--version", default=None, help="the sae-lens version the yaml comes from, recorded")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    table = {"source": f"sae-lens {args.version or '(unknown version)'}: sae_lens/pretrained_saes.yaml",
             "releases": releases(yaml.safe_load(args.yaml.read_text()))}
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {len(table['releases'])} releases to {args.out}")


if __name__ == "__main__":
    main()
