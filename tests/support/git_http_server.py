"""Local git servers that misbehave, for the fetch's timeout tests.

* ``silent_server()``: accepts TCP connections and never answers (a hung mirror
  or proxy), whatever the protocol.
* ``stalling_git_server(root, answer)``: serves the git repositories under
  ``root`` over smart HTTP through ``git http-backend`` (the reference CGI), for
  the first ``answer`` requests, then accepts and never answers: a server that
  starts a transfer and stops midway.
* ``answers_everything_server()``: answers 200 and an empty body to every request:
  no git there, though every request succeeds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


class _GitHandler(BaseHTTPRequestHandler):
    server: "_StallingServer"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _serve(self) -> None:
        with self.server.lock:
            self.server.requests += 1
            answer = self.server.requests <= self.server.answer
        if not answer:
            self.server.stop.wait()
            return
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_PROJECT_ROOT": str(self.server.root),
               "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": self.command, "PATH_INFO": path,
               "QUERY_STRING": query, "CONTENT_TYPE": self.headers.get("Content-Type", ""),
               "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1"}
        # CGI: every request header as HTTP_<NAME> (Git-Protocol, Content-Encoding: gzip).
        env.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in self.headers.items()})
        proc = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
        if proc.returncode:
            raise RuntimeError(f"git http-backend {self.command} {self.path}: {proc.stderr.decode(errors='replace')}")
        out = proc.stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        headers = [line.split(":", 1) for line in head.decode().split("\r\n") if ":" in line]
        status = next((int(v.split()[0]) for k, v in headers if k.lower() == "status"), 200)
        self.send_response(status)
        for key, value in headers:
            if key.lower() != "status":
                self.send_header(key, value.strip())
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _serve
    do_POST = _serve


class _StallingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, answer: int):
        super().__init__(("127.0.0.1", 0), _GitHandler)
        self.root, self.answer, self.requests = root, answer, 0
        self.lock, self.stop = threading.Lock(), threading.Event()


@contextlib.contextmanager
def stalling_git_server(root: Path, answer: int) -> Iterator[str]:
    """http://127.0.0.1:<port>/ serving the repositories under <root>; every
    request after the first <answer> is accepted and never answered."""
    server = _StallingServer(root, answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


class _AnswersEverything(BaseHTTPRequestHandler):
    """200 with an empty text/plain body for every request: what a misconfigured web server,
    a captive portal or a wrong path behind a catch-all route answers. git takes its empty
    info/refs for a dumb-HTTP repository with no refs."""

    def log_message(self, *args) -> None:
        self.server.requests += 1  # type: ignore[attr-defined]

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b""
        listed = getattr(self.server, "listed_commit", "")
        if listed and self.path.split("?")[0].endswith("/info/refs"):
            # A dumb-HTTP ref list naming the commit: it passes a first contact that asks for a ref.
            body = f"{listed}\tHEAD\n{listed}\trefs/heads/main\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _answer


@contextlib.contextmanager
def answers_everything_server(listed_commit: str = "") -> Iterator[ThreadingHTTPServer]:
    """http://127.0.0.1:<port>/ answering 200 and nothing to every request; .requests counts them.
    With <listed_commit>, its info/refs lists that commit as HEAD and main (a hostile mirror)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    server.daemon_threads = True
    server.requests = 0  # type: ignore[attr-defined]
    server.listed_commit = listed_commit  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
