"""A small HTTP file server for offline download tests, with fault injection.

    with FileServer(official_layout_files(), faults={path: [503, Cut(1000)]}) as server:
        monkeypatch.setenv("GPT2_NUMPY_BASE_URL", server.url)

It listens on 127.0.0.1 only, at a random free port, and stops when the `with` block ends. It serves
{url_path: bytes or file Path}, answers Range requests with 206 like a real file store, and records every request
in `server.requests` as (path, Range header or None, status).

`faults[path]` is a queue: each request for that path takes the next fault, and once the queue is empty the path is
served normally. A fault is an HTTP status to answer with, a Cut (the connection drops after that many body bytes
although Content-Length promised all), a Throttle (the body trickles out slowly, so that a test can stop the client
mid-file), or a threading.Event to wait for before serving normally.

Misbehaving servers, for every request:
- `ignore_range=True` answers every request with 200 and the whole file, as some servers do;
- `resume_from_zero=True` answers a Range request with 206 but the whole file, Content-Range `bytes 0-(n-1)/n`;
- `overlong=k` appends k bytes beyond the range its 206 answers announce (Content-Length counts them).

`published={path: (sha256 hex, size)}` sends them as the Hugging Face hub does for an LFS file, on every answer for
that path: `X-Linked-Etag: "<sha256>"` and `X-Linked-Size: <size>` (whatever bytes the path actually serves);
`weak_etags=True` marks the etag weak, `W/"<sha256>"`, as a proxy that may transform the body does.
`redirects={path: other path}` answers path with a 302 to the other, as the hub's resolve URL sends its LFS files to
their store: the published headers then come on the redirect only, and the store answers without them.
"""
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.conftest import FIXTURES, official_path

HOLD_SECONDS = 30  # a held response is released by then even if a failing test never sets its Event
THROTTLE_PIECE = 4096  # bytes a throttled body sends at a time


@dataclass(frozen=True)
class Cut:
    after: int  # body bytes sent before the connection drops


@dataclass(frozen=True)
class Throttle:
    bytes_per_second: int  # the body's pace; the tiny data file (535 KiB) at 100_000 takes 5.5 s


class FileServer:
    def __init__(self, files, faults=None, ignore_range=False, resume_from_zero=False, overlong=0, published=None,
                 redirects=None, weak_etags=False):
        self.files = {path: content if isinstance(content, bytes) else Path(content).read_bytes()
                      for path, content in files.items()}
        self.faults = {path: list(queue) for path, queue in (faults or {}).items()}
        self.ignore_range = ignore_range
        self.resume_from_zero = resume_from_zero
        self.overlong = overlong
        self.published = published or {}
        self.weak_etags = weak_etags
        self.redirects = redirects or {}
        self.requests = []
        self.faults_lock = threading.Lock()

    def __enter__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), FileHandler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        # a short poll interval makes shutdown prompt: serve_forever checks for it only that often
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        return self

    def __exit__(self, *exc_info):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def next_fault(self, path):  # -> the fault for this request, or None
        with self.faults_lock:
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None

    def requested(self, path):  # -> list of the Range headers (None without one) of the requests for path
        return [range_header for requested, range_header, _ in self.requests if requested == path]

    def requests_for(self, path):  # -> list of (Range header or None, status) of the requests for path
        return [(range_header, status) for requested, range_header, status in self.requests if requested == path]


class FileHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do, so the client's connection reuse is exercised

    def do_GET(self):
        owner = self.server.owner
        if self.path in owner.redirects:
            return self.answer(self.headers.get("Range"), 302, {"Location": owner.redirects[self.path]})
        fault = owner.next_fault(self.path)
        if isinstance(fault, threading.Event):
            fault.wait(HOLD_SECONDS)
        body = owner.files.get(self.path)
        range_header = self.headers.get("Range")
        if isinstance(fault, int) or body is None:
            return self.answer(range_header, fault if isinstance(fault, int) else 404)
        start = None if owner.ignore_range else range_start(range_header)
        if start is not None and start >= len(body):
            return self.answer(range_header, 416, {"Content-Range": f"bytes */{len(body)}"})
        if start is None:
            return self.answer(range_header, 200, {}, body, fault)
        start = 0 if owner.resume_from_zero else start
        headers = {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"}
        self.answer(range_header, 206, headers, body[start:] + b"x" * owner.overlong, fault)

    def answer(self, range_header, status, headers=None, body=b"", fault=None):
        owner = self.server.owner
        owner.requests.append((self.path, range_header, status))
        self.send_response(status)
        linked = owner.published.get(self.path)
        if linked:
            etag = ("W/" if owner.weak_etags else "") + f'"{linked[0]}"'
            headers = {**(headers or {}), "X-Linked-Etag": etag, "X-Linked-Size": str(linked[1])}
        for name, value in {**(headers or {}), "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.send_body(body, fault)
        except (BrokenPipeError, ConnectionResetError):  # the client is gone (a test killed it): nothing to finish
            self.close_connection = True

    def send_body(self, body, fault):
        if isinstance(fault, Cut):
            self.wfile.write(body[:fault.after])
            self.close_connection = True  # the rest that Content-Length promised never comes
        elif isinstance(fault, Throttle):
            for start in range(0, len(body), THROTTLE_PIECE):
                self.wfile.write(body[start:start + THROTTLE_PIECE])
                self.wfile.flush()
                time.sleep(THROTTLE_PIECE / fault.bytes_per_second)
        else:
            self.wfile.write(body)

    def log_message(self, *args):  # keep test output clean
        pass


def range_start(range_header):  # -> first byte asked for by "bytes=N-" (the form downloaders send), or None
    found = re.fullmatch(r"bytes=(\d+)-", range_header or "")
    return int(found[1]) if found else None


def official_layout_files(size="124M"):  # -> {url_path: Path}: the tiny TF checkpoint + official tokenizer files
    tf_tiny = FIXTURES / "tf_tiny"
    names = ("checkpoint", "hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001")
    return {
        **{f"/{size}/{name}": tf_tiny / name for name in names},
        **{f"/{size}/{name}": official_path(f"124M/{name}") for name in ("encoder.json", "vocab.bpe")},
    }


def hf_layout_files(size="124M"):  # -> {url_path: Path}: the tiny safetensors model + official tokenizer files
    hf_tiny = FIXTURES / "hf_tiny"
    return {
        f"/{size}/model.safetensors": hf_tiny / "model.safetensors",
        f"/{size}/config.json": hf_tiny / "config.json",
        f"/{size}/vocab.json": official_path("124M/encoder.json"),  # HF's copies of the same vocabulary
        f"/{size}/merges.txt": official_path("124M/vocab.bpe"),
    }
