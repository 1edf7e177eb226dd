"""The kubelet's HTTPS endpoint for ``kubectl logs``: the API server proxies
``/containerLogs/<namespace>/<pod>/<container>`` here (``tailLines``, ``follow`` supported).

A container's log file holds every run of it (restarts append), so ``--previous`` shows the same.
"""

from __future__ import annotations

import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

FOLLOW_POLL_SECONDS = 0.2


def _tail(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def start_log_server(
    host: str, port: int, cert: Path, key: Path, pod_logs: Path
) -> ThreadingHTTPServer:
    """Serve container logs from ``pod_logs`` over TLS on ``host:port`` in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "Only /containerLogs/<ns>/<pod>/<container> is served")
                return
            path = pod_logs / f"{parts[1]}_{parts[2]}_{parts[3]}.log"
            if not path.exists():
                self.send_error(404, f"No log for container {parts[3]} of {parts[1]}/{parts[2]}")
                return
            query = parse_qs(url.query)
            data = path.read_bytes()
            if "tailLines" in query:
                data = _tail(data, int(query["tailLines"][0]))
            follow = query.get("follow", ["false"])[0] == "true"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if not follow:
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            offset = path.stat().st_size
            try:
                self._chunk(data)
                while path.exists():
                    size = path.stat().st_size
                    if size > offset:
                        with path.open("rb") as handle:
                            handle.seek(offset)
                            self._chunk(handle.read(size - offset))
                        offset = size
                    time.sleep(FOLLOW_POLL_SECONDS)
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                return

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="log-server", daemon=True).start()
    return server
