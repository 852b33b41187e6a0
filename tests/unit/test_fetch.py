"""gpt2_numpy/fetch.py, all offline: a local server (tests/http_server.py) plays OpenAI's store, the Hugging Face hub
or a mirror, and breaks connections, answers errors and publishes hashes. Expected bytes are the files the server was
given; expected URLs and Range offsets come from the specification and simple arithmetic."""
import hashlib
import socket
from types import SimpleNamespace
from pathlib import Path

import pytest
import requests
import urllib3

from gpt2_numpy import fetch
from gpt2_numpy.fetch import file_url
from gpt2_numpy.errors import DownloadError, UsageError
from gpt2_numpy.loading import DOWNLOAD_LOCK, DOWNLOADS
from tests.http_server import Cut, hf_layout_files, official_layout_files
from tests.download_helpers import (
    DATA, HF_NAMES, HF_WEIGHTS, OPENAI_FILES, SMALL_CHUNK, WAIT_SECONDS, assert_installed, flip_a_bit, hub_like,
    layout_names_in, mirror, names_in, published, ready_folder, unlike_at_the_end,
)
from tests.download_helpers import fast_and_isolated  # noqa: F401 (an autouse fixture)


def test_fresh_download_is_byte_exact_and_says_where(tmp_path, monkeypatch, capsys):
    files = official_layout_files()
    with mirror(monkeypatch, files) as server:
        folder = ready_folder("124M", tmp_path / "models")
    assert folder == tmp_path / "models" / "124M"
    assert_installed(folder, files)
    assert sorted(server.requests) == sorted((path, None, 200) for path in files)  # each file once, no resumes
    stderr = capsys.readouterr().err
    assert str(folder) in stderr
    assert "model.ckpt.data-00000-of-00001: 100%" in stderr  # the per-file progress bar reached the end


def test_connection_cut_mid_file_resumes_with_range(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    kept = 5 * SMALL_CHUNK
    cuts = 5  # more than 1 + 3 retries: each cut adds bytes, so none of them counts against the retries
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)] * cuts}) as server:
        folder = ready_folder("124M", tmp_path)
    assert server.requested(DATA) == [None] + [f"bytes={n * kept}-" for n in range(1, cuts + 1)]
    assert_installed(folder, files)


def test_a_connection_that_always_breaks_within_a_megabyte_still_gets_the_file(tmp_path, monkeypatch):
    # with a chunk of 1 MB, every cut lost all its bytes, and four such attempts gave up
    files = official_layout_files()
    with mirror(monkeypatch, files, faults={DATA: [Cut(100_000)] * 20}) as server:
        folder = ready_folder("124M", tmp_path)
    assert len(server.requested(DATA)) > 4  # more cuts than the retries allow, each of them progress
    assert_installed(folder, files)


@pytest.mark.parametrize("ignore_range, resumed_status", [(False, 206), (True, 200)])
def test_rerun_resumes_partial_file_or_restarts_when_range_is_ignored(tmp_path, monkeypatch, ignore_range,
                                                                       resumed_status):
    monkeypatch.setattr(fetch, "RETRIES", 0)  # the 503 after the cut ends the first run
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    kept = 10 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 7), 503]}, ignore_range=ignore_range) as server:
        with pytest.raises(DownloadError, match="503"):
            ready_folder("124M", tmp_path)
        assert layout_names_in(tmp_path / "124M") == set()
        folder = ready_folder("124M", tmp_path)
    data_requests = [(range_header, status) for path, range_header, status in server.requests if path == DATA]
    assert data_requests == [(None, 200), (f"bytes={kept}-", 503), (f"bytes={kept}-", resumed_status)]
    assert all(len(server.requested(path)) == 1 for path in files if path != DATA)  # finished files were kept
    assert_installed(folder, files)


def test_missing_file_404_fails_at_once_naming_the_url(tmp_path, monkeypatch):
    files = official_layout_files()
    del files["/124M/vocab.bpe"]
    with mirror(monkeypatch, files) as server:
        with pytest.raises(DownloadError, match=rf"{server.url}/124M/vocab\.bpe answered HTTP 404"):
            ready_folder("124M", tmp_path)
    assert server.requested("/124M/vocab.bpe") == [None]  # a 404 is not retried
    assert layout_names_in(tmp_path / "124M") == set()
    # the files before vocab.bpe stay staged for a rerun
    assert names_in(tmp_path / "124M" / DOWNLOADS) == {"checkpoint", "hparams.json", "encoder.json"}


def test_server_errors_are_retried_3_times_with_doubling_waits_then_reported(tmp_path, monkeypatch):
    waits = []
    monkeypatch.setattr(fetch, "BACKOFF_SECONDS", 1.0)
    monkeypatch.setattr(fetch, "time", SimpleNamespace(sleep=waits.append))  # record the waits, skip them
    with mirror(monkeypatch, official_layout_files(), faults={"/124M/checkpoint": [503] * 4}) as server:
        with pytest.raises(DownloadError, match=r"/124M/checkpoint failed 4 times in a row \(HTTP 503"):
            ready_folder("124M", tmp_path)
    assert server.requested("/124M/checkpoint") == [None] * 4
    assert waits == [1, 2, 4]


def test_a_passing_retry_recovers_from_server_errors(tmp_path, monkeypatch):
    files = official_layout_files()
    with mirror(monkeypatch, files, faults={"/124M/encoder.json": [500, 502]}) as server:
        folder = ready_folder("124M", tmp_path)
    assert server.requested("/124M/encoder.json") == [None] * 3
    assert_installed(folder, files)


def test_connection_refused_says_what_to_fetch_by_hand(tmp_path, monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound but not listening: every connection is refused
        base = f"http://127.0.0.1:{closed.getsockname()[1]}"
        monkeypatch.setenv("GPT2_NUMPY_BASE_URL", base)
        with pytest.raises(DownloadError) as caught:
            ready_folder("124M", tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    # what the user meets first offline: no network, and what to do about it, before the URLs
    assert message.startswith(f"no network connection to 127.0.0.1:{base.rsplit(':', 1)[1]} (Connection refused): "
                              "without a network, train a tiny model on the package's own text (gpt2-numpy train "
                              "--data sample: --out my-gpt --n-layer 2 --n-embd 32 --steps 20) and pass --model "
                              "my-gpt; to download from a mirror, set GPT2_NUMPY_BASE_URL to its address (it serves "
                              "ADDRESS/124M/FILE); to install by hand, download "), message
    # it names nothing a clone has and an installed package lacks: tests/docs/test_packaging.py runs that command
    assert "README" not in message and ".md" not in message
    assert all(f"{base}/124M/{name}" in message for name in OPENAI_FILES)
    assert f"into {tmp_path / '124M'}" in message
    assert names_in(tmp_path) == set()  # the folder it made goes again: no empty .download/, no lock file left behind


def test_no_dns_fails_at_once_with_the_manual_download_message(tmp_path, monkeypatch):
    attempts = []

    def unresolvable(self, url, **kwargs):  # what requests raises when the host name has no DNS answer
        attempts.append(url)
        no_answer = socket.gaierror(-2, "Name or service not known")
        reason = urllib3.exceptions.NameResolutionError("example", None, no_answer)
        raise requests.ConnectionError(urllib3.exceptions.MaxRetryError(None, url, reason))

    monkeypatch.setattr(requests.Session, "get", unresolvable)
    with pytest.raises(DownloadError) as caught:
        ready_folder("124M", tmp_path)
    assert len(attempts) == 1  # retrying cannot bring the network back
    assert "Name or service not known" in str(caught.value)
    assert all(f"/gpt-2/models/124M/{name}" in str(caught.value) for name in OPENAI_FILES)
    assert names_in(tmp_path) == set()


@pytest.mark.parametrize("extra", [0, 10])
def test_a_part_as_long_as_the_file_is_kept_and_a_longer_one_starts_over(tmp_path, monkeypatch, capsys, extra):
    files = official_layout_files()
    data = files[DATA].read_bytes()
    staging = tmp_path / "124M" / DOWNLOADS
    staging.mkdir(parents=True)
    (staging / f"{Path(DATA).name}.part").write_bytes(data + b"x" * extra)  # killed just before the rename
    with mirror(monkeypatch, files) as server:
        folder = ready_folder("124M", tmp_path)
    assert_installed(folder, files)
    if extra:  # the file on the server changed since: its 416 announces a shorter file
        assert server.requests_for(DATA) == [(f"bytes={len(data) + extra}-", 416), (None, 200)]
        assert "starting over" in capsys.readouterr().err
    else:  # 416 "bytes */N" for a part of N bytes: the part is the whole file
        assert server.requests_for(DATA) == [(f"bytes={len(data)}-", 416)]
        assert "starting over" not in capsys.readouterr().err


def test_a_resume_answered_from_byte_0_is_refused_and_the_part_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    data = files[DATA].read_bytes()
    kept = 5 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)]}, resume_from_zero=True) as server:
        with pytest.raises(DownloadError) as caught:
            ready_folder("124M", tmp_path)
    assert server.requested(DATA) == [None] + [f"bytes={kept}-"] * 4  # the cut, then 1 + 3 retries that add nothing
    assert f"Content-Range 'bytes 0-{len(data) - 1}/{len(data)}'" in str(caught.value)
    # appending the whole file after the kept bytes would have made a part that is neither file nor prefix
    assert (tmp_path / "124M" / DOWNLOADS / f"{Path(DATA).name}.part").read_bytes() == data[:kept]


def test_a_part_growing_past_the_announced_size_is_deleted_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = official_layout_files()
    size = files[DATA].stat().st_size
    kept = 5 * SMALL_CHUNK
    with mirror(monkeypatch, files, faults={DATA: [Cut(kept + 100)]}, overlong=10 * SMALL_CHUNK) as server:
        folder = ready_folder("124M", tmp_path)
    # the resumed answer runs past the size it announced: the part goes, and the next request starts from byte 0
    # rather than asking to resume beyond the end of the file
    assert server.requests_for(DATA) == [(None, 200), (f"bytes={kept}-", 206), (None, 200)]
    assert f"more than the {size:,} bytes" in capsys.readouterr().err
    assert_installed(folder, files)


@pytest.mark.parametrize("mirror", ["notaurl", "ftp://example.org/gpt-2", "127.0.0.1:8000"])
def test_a_mirror_that_is_no_http_address_is_refused_by_the_variable_s_name(tmp_path, monkeypatch, mirror):
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", mirror)
    with pytest.raises(UsageError) as caught:
        ready_folder("124M", tmp_path)
    assert str(caught.value) == (f"GPT2_NUMPY_BASE_URL is {mirror!r}, not an http:// or https:// address: fix it, "
                                 "or unset it to download from the official servers")
    assert names_in(tmp_path) == set()


def test_default_urls_follow_the_official_stores(monkeypatch):
    assert file_url("124M", "openai", "vocab.bpe") == (
        "https://openaipublic.blob.core.windows.net/gpt-2/models/124M/vocab.bpe")
    assert file_url("1558M", "huggingface", "model.safetensors") == (
        "https://huggingface.co/openai-community/gpt2-xl/resolve/main/model.safetensors")
    assert file_url("355M", "huggingface", "config.json") == (
        "https://huggingface.co/openai-community/gpt2-medium/resolve/main/config.json")
    monkeypatch.setenv("GPT2_NUMPY_BASE_URL", "http://mirror.example/gpt2/")
    assert file_url("774M", "huggingface", "merges.txt") == "http://mirror.example/gpt2/774M/merges.txt"


@pytest.mark.parametrize("redirected", [False, True], ids=["served", "redirected"])
def test_a_huggingface_download_matching_its_published_sha256_is_installed(tmp_path, monkeypatch, capsys, redirected):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", SMALL_CHUNK)
    files = hf_layout_files()
    data = files[HF_WEIGHTS].read_bytes()
    served, options = hub_like(files, data) if redirected else (files, {})
    weights_path = options["redirects"][HF_WEIGHTS] if redirected else HF_WEIGHTS
    with mirror(monkeypatch, served, faults={weights_path: [Cut(3 * SMALL_CHUNK + 5)]},
                **{**options, "published": {HF_WEIGHTS: published(data)}}) as server:
        folder = ready_folder("124M", tmp_path, source="huggingface")
    assert server.requested(weights_path) == [None, f"bytes={3 * SMALL_CHUNK}-"]  # the hash covers both requests
    assert_installed(folder, files)
    assert "checking the SHA-256 of model.safetensors" in capsys.readouterr().err


def test_a_part_an_earlier_run_left_counts_in_the_published_sha256(tmp_path, monkeypatch):
    # the hash is taken as the bytes arrive: the bytes an earlier run wrote are read once, and the rest is appended
    files = hf_layout_files()
    data = files[HF_WEIGHTS].read_bytes()
    staging = tmp_path / "124M-hf" / DOWNLOADS
    staging.mkdir(parents=True)
    (staging / "model.safetensors.part").write_bytes(data[:3 * SMALL_CHUNK + 5])
    with mirror(monkeypatch, files, published={HF_WEIGHTS: published(data)}) as server:
        folder = ready_folder("124M", tmp_path, source="huggingface")
    assert server.requested(HF_WEIGHTS) == [f"bytes={3 * SMALL_CHUNK + 5}-"]
    assert_installed(folder, files)


@pytest.mark.parametrize("redirected", [False, True], ids=["served", "redirected"])
@pytest.mark.parametrize("damage", ["a flipped byte", "a wrong size"])
def test_a_huggingface_download_unlike_its_published_sha256_is_deleted_and_fetched_again(tmp_path, monkeypatch,
                                                                                         damage, redirected):
    files = hf_layout_files()
    data = files[HF_WEIGHTS].read_bytes()
    served = flip_a_bit(data, len(data) - 10) if damage == "a flipped byte" else data  # inside the last tensor
    digest, size = published(data)
    announced = (digest, size) if damage == "a flipped byte" else (digest, size + 4)
    folder = tmp_path / "124M-hf"
    served_files, options = hub_like(files, served) if redirected else ({**files, HF_WEIGHTS: served}, {})
    with mirror(monkeypatch, served_files, **{**options, "published": {HF_WEIGHTS: announced}}):
        with pytest.raises(DownloadError) as caught:
            ready_folder("124M", tmp_path, source="huggingface")
    message = str(caught.value)
    if damage == "a flipped byte":
        assert f"has SHA-256 {hashlib.sha256(served).hexdigest()} but the server published {digest}" in message
    else:
        assert f"has {size:,} bytes but the server published X-Linked-Size {size + 4:,}" in message
    assert message.endswith("deleted it, so the next run fetches a fresh copy")
    assert names_in(folder) == {DOWNLOAD_LOCK, DOWNLOADS}  # nothing installed, no marker
    assert names_in(folder / DOWNLOADS) == HF_NAMES - {"model.safetensors"}
    with mirror(monkeypatch, files, published={HF_WEIGHTS: published(data)}) as server:
        assert_installed(ready_folder("124M", tmp_path, source="huggingface"), files)
    assert server.requests == [(HF_WEIGHTS, None, 200)]


def test_a_published_sha256_unlike_only_in_its_last_digits_is_refused(tmp_path, monkeypatch):
    files = hf_layout_files()
    digest, size = published(files[HF_WEIGHTS].read_bytes())
    announced = unlike_at_the_end(digest)
    assert announced[:60] == digest[:60] and announced != digest
    with mirror(monkeypatch, files, published={HF_WEIGHTS: (announced, size)}):
        with pytest.raises(DownloadError, match=f"has SHA-256 {digest} but the server published {announced} "):
            ready_folder("124M", tmp_path, source="huggingface")
    assert names_in(tmp_path / "124M-hf" / DOWNLOADS) == HF_NAMES - {"model.safetensors"}  # deleted


@pytest.mark.parametrize("damage", [None, "a flipped byte"])
def test_a_weak_x_linked_etag_is_checked_as_the_sha256_it_holds(tmp_path, monkeypatch, capsys, damage):
    # W/"<sha256>" does not promise identical bytes, and the hub has sent its hashes so: the file is held to the hash
    # all the same, since the structure check alone passes a flipped byte inside a tensor
    files = hf_layout_files()
    data = files[HF_WEIGHTS].read_bytes()
    served = flip_a_bit(data, len(data) - 10) if damage else data  # inside the last tensor
    digest, size = published(data)
    with mirror(monkeypatch, {**files, HF_WEIGHTS: served}, published={HF_WEIGHTS: (digest, size)},
                weak_etags=True) as server:
        assert requests.get(server.url + HF_WEIGHTS, timeout=WAIT_SECONDS).headers["X-Linked-Etag"] == f'W/"{digest}"'
        if damage:
            with pytest.raises(DownloadError, match=f"has SHA-256 {hashlib.sha256(served).hexdigest()} but the "
                                                    f"server published {digest} "):
                ready_folder("124M", tmp_path, source="huggingface")
        else:
            assert_installed(ready_folder("124M", tmp_path, source="huggingface"), files)
    assert "checking the SHA-256 of model.safetensors" in capsys.readouterr().err


def test_a_safetensors_download_without_a_published_sha256_says_so(tmp_path, monkeypatch, capsys):
    files = hf_layout_files()
    with mirror(monkeypatch, files) as server:  # a mirror that sends no X-Linked-Etag
        assert_installed(ready_folder("124M", tmp_path, source="huggingface"), files)
    stderr = capsys.readouterr().err
    assert f"note: {server.url}{HF_WEIGHTS} came without a published SHA-256" in stderr
    assert stderr.count("without a published SHA-256") == 1  # config.json and the vocabulary never have one
