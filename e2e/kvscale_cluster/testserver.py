"""The ``kvscale/testserver`` image: a small HTTP server for the cluster's own tests.

``GET /`` answers with the pod's name and address, ``GET /healthz`` with ok, ``GET /metrics`` with
a Prometheus counter of requests. It also stands in for the engine in the operator's
control-plane tests: it answers the engine's ``/health``, ``/ready`` and ``/drain`` and ignores
the engine arguments it does not know. With ``--burn`` a thread keeps one CPU busy (the CPU-limit
tests). On SIGTERM it writes ``$TERM_MARKER_DIR/<pod>`` (when set),
waits ``--term-delay`` seconds, and exits 0: the graceful-shutdown tests look for that file.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from .body_handler import BodyHandler


class Handler(BodyHandler):
    server: Server

    def do_GET(self) -> None:
        self.server.requests += 1
        name = os.environ.get("POD_NAME", os.environ.get("HOSTNAME", "testserver"))
        routes = {
            "/": f"hello from {name} at {os.environ.get('POD_IP', '?')}\n",
            "/healthz": "ok\n",
            "/health": "ok\n",
            "/ready": "ok\n",
            "/drain": "drained\n",
            "/metrics": (
                "# TYPE testserver_requests_total counter\n"
                f"testserver_requests_total {self.server.requests}\n"
            ),
        }
        body = routes.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.reply(body.encode(), "text/plain; version=0.0.4")

    def log_message(self, format: str, *args: object) -> None:
        sys.stdout.write(f"{self.address_string()} {format % args}\n")


class Server(ThreadingHTTPServer):
    requests = 0


def _burn() -> None:
    while True:
        sum(range(10_000))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvscale-testserver")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--term-delay", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=None, help="exit at once with this code")
    parser.add_argument("--burn", action="store_true", help="keep one CPU busy while serving")
    args, _engine_args = parser.parse_known_args(argv)
    if args.exit_code is not None:
        print(f"Exiting with {args.exit_code} as asked", flush=True)
        sys.exit(args.exit_code)
    server = Server((args.host, args.port), Handler)

    def on_term(signum: int, _frame: FrameType | None) -> None:
        print(f"Got signal {signum}; shutting down", flush=True)
        marker_dir = os.environ.get("TERM_MARKER_DIR")
        if marker_dir:
            name = os.environ.get("POD_NAME", "testserver")
            Path(marker_dir, name).write_text(f"{signum}\n")
        time.sleep(args.term_delay)
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, on_term)
    if args.burn:
        threading.Thread(target=_burn, name="burn", daemon=True).start()
    print(f"Serving on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    print("Stopped", flush=True)


if __name__ == "__main__":
    main()
