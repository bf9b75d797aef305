"""Serves a run's images over HTTP for servers that fetch them (``images.transport: url``).

A threaded ``http.server`` on an ephemeral port, holding each image's file bytes in memory under
its name (``<digest>.jpg``); a request for any other path is answered 404. It listens on the
address this machine uses to reach the inference server (127.0.0.1 for a local one), so a server
on another machine can fetch from it, and it runs in its own thread: the fetches never touch the
load generator's event loop.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pytest_llmperf.traffic.images import MIME, file_name

if TYPE_CHECKING:
    from pytest_llmperf.traffic.images import ImageDraw


def local_address_for(base_url: str) -> str:
    """The address of this machine on the route to ``base_url``'s host (a UDP socket's connect
    sends nothing; it only picks the route)."""
    host = urlsplit(base_url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class ImageServer:
    """Use as ``with ImageServer(base_url) as images: factory = PromptFactory(..., image_host=images.add)``."""

    def __init__(self, base_url: str) -> None:
        self.host = local_address_for(base_url)
        self._files: dict[str, tuple[bytes, str]] = {}
        self.fetches = 0
        files = self._files
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                entry = files.get(self.path.lstrip("/"))
                if entry is None:
                    self.send_error(404, "no such image")
                    return
                data, mime = entry
                server_self.fetches += 1
                self.send_response(200)
                self.send_header("Content-Type", mime)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                return  # the run's own records say what happened; no stderr line per fetch

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="llmperf-images", daemon=True)

    def add(self, image: ImageDraw, data: bytes, fmt: str) -> str:
        """Serve ``data`` as ``image``'s file; return its URL."""
        name = file_name(image, fmt)
        self._files[name] = (data, MIME[fmt])
        return f"http://{self.host}:{self.port}/{name}"

    def __enter__(self) -> ImageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


__all__ = ["ImageServer", "local_address_for"]
