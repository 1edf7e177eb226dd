"""A fixed list of replicas, for local use and the engine-tier tests: `--replicas a=URL,URL`.

Weights come from an optional JSON file in the ConfigMap's format, read at start and again on
SIGHUP (a signal, not a poll); without one every replica has weight 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from urllib.parse import urlsplit

from kvscale_router.replicas import Pod, ReplicaSource, ReplicaTable
from kvscale_router.weights import WeightsError, parse_weights

log = logging.getLogger(__name__)


def parse_replicas(text: str) -> dict[str, str]:
    """'a=http://h:1,http://h:2' -> {'a': 'http://h:1', 'h:2': 'http://h:2'}."""
    replicas: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, url = item.partition("=")
        if not sep:
            name, url = "", item
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"replica {item!r} is not [name=]http://host:port")
        name = name or parts.netloc
        if name in replicas:
            raise ValueError(f"replica name {name!r} is given twice")
        replicas[name] = url.rstrip("/")
    if not replicas:
        raise ValueError("--replicas names no replica")
    return replicas


class StaticSource(ReplicaSource):
    def __init__(self, replicas: dict[str, str], weights_file: Path | None = None) -> None:
        self.replicas = replicas
        self.weights_file = weights_file

    @property
    def description(self) -> str:
        return f"static replicas {', '.join(self.replicas)}"

    def reload(self, table: ReplicaTable) -> None:
        if self.weights_file is None:
            return
        try:
            table.set_published(parse_weights(self.weights_file.read_text()))
            log.info("Loaded routing weights from %s", self.weights_file)
        except (OSError, WeightsError) as exc:
            log.error("Kept the last routing weights: %s: %s", self.weights_file, exc)

    async def run(self, table: ReplicaTable) -> None:
        table.set_pods({n: Pod(n, url, 0.0) for n, url in self.replicas.items()})
        self.reload(table)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload, table)
        try:
            await asyncio.Event().wait()
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
