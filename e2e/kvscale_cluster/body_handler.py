"""The request handler of the harness's small HTTP servers (pod discovery, the testserver image,
the exporters of the tests): each answers with a whole body, sized."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class BodyHandler(BaseHTTPRequestHandler):
    """``reply`` sends 200 with a whole body; nothing is logged unless a subclass logs."""

    def reply(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return
