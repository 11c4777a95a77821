"""The dashboard's HTTP server (the standard library's): `/` the page, `/api/swarm` its data.

The page (`page.html`) carries its script and styles inline and loads nothing else, so it works
on a machine without internet access. It has no login: the default host is loopback.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

logger = logging.getLogger(__name__)

API_PATH = "/api/swarm"


class DashboardPortError(RuntimeError):
    """The page cannot be served where it was asked to; the message names the flag."""


def page_html() -> bytes:
    return resources.files("p2p_trainer.dashboard").joinpath("page.html").read_bytes()


def _handler(page: bytes, snapshot: Callable[[], dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", page)
            elif path == API_PATH:
                self._send(200, "application/json", json.dumps(snapshot(), allow_nan=False).encode())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: the page is at /\n")

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # one line per poll would flood the log
            logger.debug("%s " + format, self.address_string(), *args)

    return Handler


class DashboardServer:
    """Bound on construction (an occupied port raises `DashboardPortError` naming `flag`), serving
    from a daemon thread after `start`, until `close`."""

    def __init__(
        self, host: str, port: int, snapshot: Callable[[], dict[str, Any]], flag: str = "--port"
    ) -> None:
        try:
            self._server = ThreadingHTTPServer((host, port), _handler(page_html(), snapshot))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DashboardPortError(
                    f"{flag} {port}: the port is already in use on {host}; pick a free port for {flag} "
                    f"or stop what listens on it"
                ) from None
            raise DashboardPortError(
                f"{flag} {port}: cannot listen on {host} (--host): {exc.strerror or exc}"
            ) from None
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="dashboard", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
