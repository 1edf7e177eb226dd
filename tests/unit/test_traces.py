"""Named public traces: pinned URLs, download on demand into the cache, checksum, offline error.

A loopback HTTP server (and a file:// mirror) stands in for raw.githubusercontent.com, which this
machine cannot reach; it serves the committed sample in the repository's own layout.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvscale import traces
from kvscale.traces import PublicTrace, TraceError, download, load_trace

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "traces"
CONV = SAMPLE / traces.TRACE_FILES["azure-conv"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server holding the sample conv trace at its pinned repository path."""
    pinned = traces.PUBLIC_TRACES["azure-conv"]
    root = tmp_path / "mirror"
    target = root / pinned.repo / pinned.commit / pinned.path
    target.parent.mkdir(parents=True)
    shutil.copy(CONV, target)
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVSCALE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "traces"


def sample_pinned(sha256: str | None = None) -> PublicTrace:
    """The conv trace's pin with the sample's checksum (or `sha256`) for the full file's."""
    pinned = traces.PUBLIC_TRACES["azure-conv"]
    digest = sha256 or hashlib.sha256(CONV.read_bytes()).hexdigest()
    return PublicTrace(pinned.repo, pinned.commit, pinned.path, digest, pinned.licence)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_public_traces_are_pinned_to_a_commit_and_a_checksum() -> None:
    readme = (SAMPLE / "README.md").read_text()
    for name, pinned in traces.PUBLIC_TRACES.items():
        assert name in traces.TRACE_FILES
        assert re.fullmatch(r"[0-9a-f]{40}", pinned.commit) and pinned.commit in readme
        assert re.fullmatch(r"[0-9a-f]{64}", pinned.sha256) and pinned.sha256 in readme
        assert pinned.url() == (
            f"https://raw.githubusercontent.com/{pinned.repo}/{pinned.commit}/{pinned.path}"
        )
        assert pinned.licence in readme


def test_download_keeps_a_file_with_the_pinned_checksum(mirror: str, tmp_path: Path) -> None:
    dest = download(sample_pinned(), tmp_path / "got" / "conv.csv", base_url=mirror)
    assert dest.read_bytes() == CONV.read_bytes()


def test_download_refuses_a_file_with_another_checksum(mirror: str, tmp_path: Path) -> None:
    dest = tmp_path / "got" / "conv.csv"
    with pytest.raises(TraceError, match=f"not the pinned {'0' * 64}: refused"):
        download(sample_pinned("0" * 64), dest, base_url=mirror)
    assert list(dest.parent.iterdir()) == []  # neither the file nor a partial one


def test_offline_download_is_a_clear_error(tmp_path: Path) -> None:
    dest = tmp_path / "got" / "conv.csv"
    with pytest.raises(TraceError) as failed:
        download(sample_pinned(), dest, base_url=f"http://127.0.0.1:{closed_port()}")
    message = str(failed.value)
    assert "could not download http://127.0.0.1:" in message and "offline?" in message
    assert f"Copy the file to {dest}" in message and "KVSCALE_TRACES_DIR" in message
    assert list(dest.parent.iterdir()) == []


def test_a_missing_trace_is_fetched_into_the_cache_once(
    mirror: str, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(traces.PUBLIC_TRACES, "azure-conv", sample_pinned())
    monkeypatch.setenv(traces.MIRROR_ENV, mirror)
    empty = tmp_path / "empty"
    assert len(load_trace("azure-conv", empty)) == 300
    assert (cache / traces.TRACE_FILES["azure-conv"]).read_bytes() == CONV.read_bytes()
    monkeypatch.setenv(traces.MIRROR_ENV, f"http://127.0.0.1:{closed_port()}")  # now offline
    assert len(load_trace("azure-conv", empty)) == 300  # from the cache


def test_a_file_mirror_works_like_a_server(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = sample_pinned()
    folder = tmp_path / "folder-mirror"
    (folder / pinned.repo / pinned.commit / pinned.path).parent.mkdir(parents=True)
    shutil.copy(CONV, folder / pinned.repo / pinned.commit / pinned.path)
    monkeypatch.setitem(traces.PUBLIC_TRACES, "azure-conv", pinned)
    monkeypatch.setenv(traces.MIRROR_ENV, folder.as_uri())
    assert len(load_trace("azure-conv", tmp_path / "empty")) == 300


def test_offline_without_the_file_names_the_trace_and_the_folder(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(traces.MIRROR_ENV, f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(TraceError, match=r"trace 'mooncake' not found in .*empty, and could not"):
        load_trace("mooncake", tmp_path / "empty")
    assert not cache.exists() or not any(cache.rglob("*.jsonl*"))


def test_the_traces_folder_comes_from_one_variable(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(traces.TRACES_DIR_ENV, str(tmp_path / "mine"))
    assert traces.default_traces_dir() == tmp_path / "mine"
    monkeypatch.delenv(traces.TRACES_DIR_ENV)
    assert traces.default_traces_dir() == cache
