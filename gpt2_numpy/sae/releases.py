"""SAELens's released SAEs of GPT-2 small, by name: `load_sae("gpt2-small-res-jb", "blocks.8.hook_resid_pre")`, or
`--sae gpt2-small-res-jb/blocks.8.hook_resid_pre` wherever a command takes an SAE.

The table (data/sae_releases.json, written by scripts/sae/make_releases.py from the pretrained_saes.yaml that the
sae-lens package ships) gives each release's hub repo and, per id, the path of its files there, its Neuronpedia id, the
norm_scaling_factor and the published L0 and variance explained. The files are the ones SAE.from_pretrained reads:

    SAELens's layout               <path>/cfg.json, <path>/sae_weights.safetensors
    connor_rob_hook_z (hook-z-kk)  <path minus .pt>_cfg.json, <path> (torch's .pt: formats/torch_zip.py, no torch)

each fetched from the hub's resolve URL, {HF_ENDPOINT}/{repo}/resolve/main/{file} (HF_ENDPOINT as huggingface_hub
reads it, default https://huggingface.co), by fetch.py as the model's weights are: resumable, checked against the size
and SHA-256 the hub publishes, under a lock, with a progress bar, into <models dir>/saes/<repo>/ (the models dir:
$GPT2_NUMPY_WEIGHTS, else ./weights). A file there is complete and checked (fetch renames it in only then): a second
use reads it with no network. The SAE is then processed as SAELens with TransformerLens's from_pretrained computes it
(processing.py).
"""
import difflib
import json
import os
import urllib.parse
from functools import lru_cache
from importlib import resources
from pathlib import Path, PurePath, PurePosixPath

from gpt2_numpy.errors import CheckpointError, DownloadError, UsageError
from gpt2_numpy.sae import files as sae_files
from gpt2_numpy.sae.processing import FROM_PRETRAINED, processed

HUB = "https://huggingface.co"
NEURONPEDIA = "https://www.neuronpedia.org"
CONNOR = "connor_rob_hook_z"
PUBLISHED = ("l0", "variance_explained", "norm_scaling_factor")  # the one conversion among GPT-2 small's releases


@lru_cache(maxsize=1)
def releases():  # -> {release: {"repo", "conversion", "config_overrides", "links", "saes": {id: {...}}}}
    return json.loads(resources.files("gpt2_numpy").joinpath("data/sae_releases.json").read_text())["releases"]


def nearest(name, names):  # -> ", ..." of the names closest to name, for a one-line error
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5) or list(names)[:3]
    return ", ".join(close)


def release_entry(release, sae_id):  # -> (release's entry, the id's entry); UsageError naming the nearest names
    table = releases()
    if release not in table:
        raise UsageError(f"unknown SAE release {release!r}: the nearest are {nearest(release, table)} "
                         "(gpt2-numpy sae releases lists them all)")
    saes = table[release]["saes"]
    if sae_id not in saes:
        raise UsageError(f"release {release} has no SAE {sae_id!r}: the nearest are {nearest(sae_id, saes)} "
                         f"({len(saes)} in all: gpt2-numpy sae releases {release})")
    return table[release], saes[sae_id]


def split_name(text):  # -> (release, id) of "RELEASE/ID" (a str, or the Path a command's argument made of it) when
    # RELEASE looks like a release's name, else None
    release, _, sae_id = (text.as_posix() if isinstance(text, PurePath) else str(text)).partition("/")
    if sae_id and (release in releases() or release.startswith("gpt2-small")):
        return release, sae_id
    return None


def hub_files(entry, sae):  # -> [the repo paths SAE.from_pretrained reads]: the cfg first, then the weights
    path = sae["path"]
    if entry["conversion"] == CONNOR:
        return [path.split(".pt")[0] + "_cfg.json", path]
    if entry["conversion"] is not None:
        raise UsageError(f"conversion {entry['conversion']!r} is not supported here")
    return [f"{path}/cfg.json", f"{path}/sae_weights.safetensors"]


def hub_url(repo, path):  # -> the hub's resolve URL of one file; UsageError for an HF_ENDPOINT that is no address
    endpoint = os.environ.get("HF_ENDPOINT") or HUB
    if not endpoint.lower().startswith(("http://", "https://")):
        raise UsageError(f"HF_ENDPOINT is {endpoint!r}, not an http:// or https:// address: fix it, or unset it to "
                         f"download from {HUB}")
    return f"{endpoint.rstrip('/')}/{repo}/resolve/main/{urllib.parse.quote(path)}"


def cache_folder(repo, models_dir=None):  # -> Path where a repo's files are kept: <models dir>/saes/<owner>/<name>
    from gpt2_numpy.loading import models_folder

    return models_folder(models_dir) / "saes" / PurePosixPath(repo)


def local_name(path):  # -> the repo path as a file inside the cache folder; UsageError for one that would leave it
    parts = PurePosixPath(path).parts
    if not parts or any(part in ("", ".", "..") for part in parts) or PurePosixPath(path).is_absolute():
        raise UsageError(f"the repo path {path!r} is not a relative path")
    return os.path.join(*parts)


def downloaded(release, sae_id, models_dir=None):  # -> [Path] of hub_files, fetched into the cache when missing
    entry, sae = release_entry(release, sae_id)
    folder = cache_folder(entry["repo"], models_dir)
    paths = [(path, folder / local_name(path)) for path in hub_files(entry, sae)]
    missing = [(path, local) for path, local in paths if not local.exists()]
    if missing:
        fetch_files(release, sae_id, entry["repo"], folder, missing)
    return [local for _, local in paths]


def fetch_files(release, sae_id, repo, folder, missing):  # -> None: each (repo path, local Path) complete and checked
    from gpt2_numpy import fetch  # requests and tqdm are slow to import: only a download loads them
    from gpt2_numpy.console import log
    from gpt2_numpy.loading import locked

    urls = [hub_url(repo, path) for path, _ in missing]
    log(f"downloading the SAE {release}/{sae_id} from {urls[0].split('/resolve/')[0]} into {folder}")
    with locked(folder), fetch.download_session() as session:
        for url, (_, local) in zip(urls, missing):
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                fetch.fetch(session, url, local)
            except fetch.Unreachable as error:
                raise DownloadError(f"{error}: the SAE {release}/{sae_id} is not in the cache {folder} yet; connect, "
                                    "set HF_ENDPOINT to a mirror of the hub, or download "
                                    f"{' '.join(urls)} by hand into {folder}/ (keeping the repo's folders)") from None
            except fetch.NotFound as error:
                raise DownloadError(f"{str(error).split(': check')[0]}: the hub holds no such file of {repo}; check "
                                    "HF_ENDPOINT, or whether the release moved (scripts/sae/make_releases.py "
                                    "regenerates the table from a newer sae-lens)") from None
            except KeyboardInterrupt:
                raise fetch.stopped(local.parent, [local.name]) from None


def load_sae(folder, sae_id=None, models_dir=None):  # -> SAE of an SAE folder, or of a release by name:
    # load_sae(release, id) or load_sae("release/id"), downloaded into the models dir once
    named = (str(folder), sae_id) if sae_id is not None else None if Path(folder).is_dir() else split_name(folder)
    return load_release(*named, models_dir=models_dir) if named else sae_files.load_sae_folder(folder)


def load_release(release, sae_id, models_dir=None):  # -> SAE processed as SAELens's from_pretrained computes it
    entry, sae = release_entry(release, sae_id)
    cfg_path, weights_path = downloaded(release, sae_id, models_dir)
    overrides = {**entry["config_overrides"], "neuronpedia_id": sae.get("neuronpedia")}
    try:
        if entry["conversion"] == CONNOR:
            cfg = connor_cfg(cfg_path, sae_files.read_json(cfg_path))
        else:
            cfg = sae_files.checked_cfg(cfg_path, {**sae_files.read_json(cfg_path), **overrides})
        params = sae_files.read_weights(weights_path, cfg)
    except CheckpointError as error:  # damaged since it was downloaded and checked: a fresh download mends it
        raise CheckpointError(f"{error}; it is the cached download of {release}/{sae_id}: delete it, and the next "
                              "run downloads it again", files=error.files) from None
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    cfg = {**cfg, "metadata": {**metadata, "release": release, "sae_id": sae_id,
                               "neuronpedia_id": sae.get("neuronpedia")}}
    hook = sae_files.cfg_hook(cfg_path, cfg)
    return processed(cfg, params, hook, FROM_PRETRAINED, f"{release}/{sae_id}", sae.get("norm_scaling_factor"))


def connor_cfg(path, old):  # -> cfg.json's fields of a connor_rob_hook_z SAE (SAELens's get_connor_rob_hook_z_config)
    try:
        cfg = {"architecture": "standard", "d_in": old["act_size"], "d_sae": old["dict_size"], "dtype": "float32",
               "hook_name": old["act_name"], "apply_b_dec_to_input": True, "normalize_activations": "none",
               "reshape_activations": "hook_z", "sae_lens_version": "6.0.0"}
    except (KeyError, TypeError) as error:
        raise sae_files.damaged(path, f"lacks {error} (act_size, dict_size and act_name are read)") from None
    return sae_files.checked_cfg(path, cfg)


def neuronpedia_url(sae, latent):  # -> the latent's page on Neuronpedia, or None when the SAE's release names none
    metadata = sae.cfg.get("metadata") if isinstance(sae.cfg.get("metadata"), dict) else {}
    page = metadata.get("neuronpedia_id")
    return f"{NEURONPEDIA}/{page}/{latent}" if page else None


def listing(release=None):  # -> text: the releases, or one release's ids with their published numbers
    table = releases()
    if release is None:
        width = max(map(len, table))
        return "".join(f"{name:<{width}}  {len(entry['saes']):>2} SAEs  {entry['repo']}\n"
                       for name, entry in table.items())
    if release not in table:
        raise UsageError(f"unknown SAE release {release!r}: the nearest are {nearest(release, table)}")
    entry = table[release]
    rows = [sae_id + "".join(f"  {name.replace('_', ' ')} {sae[name]:g}" for name in PUBLISHED if name in sae)
            for sae_id, sae in entry["saes"].items()]
    return f"{release} ({entry['repo']}):\n" + "".join(f"  {release}/{row}\n" for row in rows)


def published(sae):  # -> {"l0", "variance_explained"}: what SAELens's list publishes for a release's SAE, {} for others
    metadata = sae.cfg.get("metadata") if isinstance(sae.cfg.get("metadata"), dict) else {}
    if "release" not in metadata:
        return {}
    entry = releases()[metadata["release"]]["saes"][metadata["sae_id"]]
    return {name: entry[name] for name in ("l0", "variance_explained") if name in entry}
