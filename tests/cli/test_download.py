"""`gpt2-numpy download` in real processes: two at once into one folder, one-line errors, and a download killed or
interrupted mid-file that resumes on the rerun."""
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from gpt2_numpy import fetch
from gpt2_numpy.loading import DOWNLOADS
from tests.http_server import FileServer, Throttle, official_layout_files
from tests.download_helpers import (
    DATA, SMALL_CHUNK, WAIT_SECONDS, assert_installed, run_cli, start_cli, start_small_chunk_cli, wait_until,
)
from tests.download_helpers import fast_and_isolated  # noqa: F401 (an autouse fixture)


def test_two_processes_downloading_into_one_folder(tmp_path):
    files = official_layout_files()
    models_dir = tmp_path / "models"
    release = threading.Event()
    processes = []
    try:
        with FileServer(files, faults={DATA: [release]}) as server:  # the first process stalls on the data file
            env = {**os.environ, "GPT2_NUMPY_BASE_URL": server.url}
            processes.append(start_cli(models_dir, env, "first"))
            wait_until(lambda: server.requests)  # the first process holds the folder's lock from now on
            processes.append(start_cli(models_dir, env, "second"))
            wait_until(lambda: "in progress" in (tmp_path / "second.err").read_text())
            release.set()
            codes = [process.wait(WAIT_SECONDS) for process in processes]
    finally:
        release.set()
        for process in processes:
            process.kill()
    assert codes == [0, 0]
    folder = models_dir / "124M"
    assert [(tmp_path / f"{name}.out").read_text() for name in ("first", "second")] == [f"{folder}\n"] * 2
    assert "already complete" in (tmp_path / "second.err").read_text()
    assert all(len(server.requested(path)) == 1 for path in files)  # the second process fetched nothing
    assert_installed(folder, files)


def test_cli_unknown_size_is_one_line_and_exit_2(tmp_path):
    result = run_cli("125M", "--models-dir", str(tmp_path))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("error: unknown model size '125M'")
    assert result.stderr.count("\n") == 1


def test_cli_http_error_is_one_error_line_and_exit_1(tmp_path):
    files = official_layout_files()
    del files[DATA]
    with FileServer(files) as server:
        result = run_cli("124M", "--models-dir", str(tmp_path), env={**os.environ, "GPT2_NUMPY_BASE_URL": server.url})
    assert (result.returncode, result.stdout) == (1, "")
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert error_lines == [f"error: {server.url}{DATA} answered HTTP 404 Not Found: check the model size, and the "
                           "mirror in GPT2_NUMPY_BASE_URL if you set one"]


@pytest.mark.skipif(sys.platform == "win32", reason="sends POSIX signals")
@pytest.mark.parametrize("stop", ["SIGKILL", "SIGINT"])
def test_a_download_stopped_mid_file_resumes_on_the_rerun_and_ends_byte_exact(tmp_path, stop):
    files = official_layout_files()
    models_dir = tmp_path / "models"
    staging = models_dir / "124M" / DOWNLOADS
    part = staging / f"{Path(DATA).name}.part"
    with FileServer(files, faults={DATA: [Throttle(100_000)]}) as server:  # 5 s for the data file, if not stopped
        env = {**os.environ, "GPT2_NUMPY_BASE_URL": server.url}
        first = start_small_chunk_cli(models_dir, env, "first")
        try:
            wait_until(lambda: fetch.bytes_in(part) >= 3 * SMALL_CHUNK)
            first.send_signal(getattr(signal, stop))
            code = first.wait(WAIT_SECONDS)
        finally:
            first.kill()
        kept = part.stat().st_size
        assert 0 < kept < files[DATA].stat().st_size
        second = start_small_chunk_cli(models_dir, env, "second")
        assert second.wait(WAIT_SECONDS) == 0
    assert server.requested(DATA) == [None, f"bytes={kept}-"]
    assert_installed(models_dir / "124M", files)
    if stop == "SIGINT":  # Ctrl-C: one line saying what was kept and that a rerun resumes
        assert code == 130
        last_line = (tmp_path / "first.err").read_text().splitlines()[-1]
        assert last_line.startswith("interrupted: ")
        assert f"{kept:,} bytes of {Path(DATA).name}" in last_line
        assert str(staging) in last_line and "resume" in last_line
