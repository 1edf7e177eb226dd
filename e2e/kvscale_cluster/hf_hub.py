"""A small Hugging Face Hub for the local cluster: what `huggingface_hub.snapshot_download` asks.

No internet here, so the e2e tests serve checkpoints they made themselves. Repositories are
folders: ``<root>/<org>/<name>/<branch>/<files>``; each branch is one commit whose hash is derived
from its files. The calls answered, as the Hub answers them:

- ``GET /api/models/<repo>/revision/<rev>``: the repo's info, with ``sha`` (the commit);
- ``GET /api/models/<repo>/tree/<rev>[/<path>]``: the files (``type``, ``path``, ``size``,
  ``oid``: the git blob hash), one page;
- ``HEAD|GET /<repo>/resolve/<rev>/<file>``: the file, with ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length``.

A missing repo answers 404 with ``X-Error-Code: RepoNotFound``, a missing branch 404 with
``RevisionNotFound``, a missing file 404 with ``EntryNotFound``; with ``--token``, a request
without ``Authorization`` answers 401 ``RepoNotFound`` (the Hub hides private repositories) and
one with another token 401 ``Invalid credentials in Authorization header``. Every request is
logged.

Run it as ``python -m kvscale_cluster.hf_hub --root DIR --port N [--token T]`` (the image
``kvscale/hfhub`` on the local cluster).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

API = "/api/models/"
INVALID_TOKEN = "Invalid credentials in Authorization header"


def blob_oid(data: bytes) -> str:
    """The git blob hash the Hub reports as a file's `oid` (and ETag, for a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """One repository folder: its branches are subfolders."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def branch(self, revision: str) -> Path | None:
        """The folder of a branch name or of a commit hash, if it exists."""
        for b in sorted(p for p in self.path.iterdir() if p.is_dir()):
            if revision in (b.name, self.commit(b)):
                return b
        return None

    def files(self, branch: Path) -> list[Path]:
        return sorted(p for p in branch.rglob("*") if p.is_file())

    def commit(self, branch: Path) -> str:
        digest = hashlib.sha1(branch.name.encode())
        for f in self.files(branch):
            digest.update(
                f.relative_to(branch).as_posix().encode() + blob_oid(f.read_bytes()).encode()
            )
        return digest.hexdigest()


class Handler(BaseHTTPRequestHandler):
    server: HubServer

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}\n")

    def _serve(self, body: bool) -> None:
        token, sent = self.server.token, self.headers.get("Authorization")
        if token and sent is None:  # as the Hub answers a private repo to an anonymous client
            return self._error(401, "RepoNotFound")
        if token and sent != f"Bearer {token}":
            return self._error(401, error_message=INVALID_TOKEN)
        path = urlsplit(self.path).path
        if path.startswith(API):
            return self._api(unquote(path[len(API) :]).split("/"))
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), unquote(parts[3]), "/".join(parts[4:]), body)
        return self._error(404, "EntryNotFound")

    def _find(self, repo_id: str, revision: str) -> tuple[Repo, Path] | None:
        """The repository and the branch a revision names, or None after answering 404."""
        folder = self.server.root / repo_id
        if repo_id.count("/") != 1 or not folder.is_dir():
            self._error(404, "RepoNotFound")
            return None
        repo = Repo(folder)
        branch = repo.branch(revision)
        if branch is None:
            self._error(404, "RevisionNotFound")
            return None
        return repo, branch

    def _api(self, parts: list[str]) -> None:
        if len(parts) < 4 or parts[2] not in ("revision", "tree"):
            return self._error(404, "EntryNotFound")
        repo_id, kind, revision = "/".join(parts[:2]), parts[2], parts[3]
        found = self._find(repo_id, revision)
        if found is None:
            return None
        repo, branch = found
        files = repo.files(branch)
        if kind == "revision":
            info = {
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit(branch),
                "private": bool(self.server.token),
                "siblings": [{"rfilename": f.relative_to(branch).as_posix()} for f in files],
            }
            return self._json(info)
        entries = [
            {
                "type": "file",
                "path": f.relative_to(branch).as_posix(),
                "size": f.stat().st_size,
                "oid": blob_oid(f.read_bytes()),
            }
            for f in files
        ]
        return self._json(entries)

    def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
        found = self._find(repo_id, revision)
        if found is None:
            return None
        repo, branch = found
        file = branch / name
        if not file.is_file() or ".." in name.split("/"):
            return self._error(404, "EntryNotFound")
        data = file.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{blob_oid(data)}"')
        self.send_header("X-Repo-Commit", repo.commit(branch))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _json(self, value: Any) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str | None = None, error_message: str = "") -> None:
        data = json.dumps({"error": error_message or code or "error"}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if error_message:
            self.send_header("X-Error-Message", error_message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], root: Path, token: str | None) -> None:
        super().__init__(address, Handler)
        self.root = root
        self.token = token


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvscale_cluster.hf_hub", description=__doc__)
    parser.add_argument("--root", type=Path, required=True, help="<org>/<name>/<branch>/files")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token", default=None, help="require this bearer token")
    args = parser.parse_args(argv)
    server = HubServer((args.host, args.port), args.root, args.token)
    sys.stderr.write(f"Serving {args.root} on {args.host}:{server.server_address[1]}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
