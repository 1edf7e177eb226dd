"""The router's log lines: text for people, or one JSON object a line for log pipelines.

In JSON mode uvicorn's own loggers propagate to the same handler (it is started without its
logging configuration), so every line the process writes parses.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from importlib import metadata

LOG_FORMATS = ("text", "json")
TEXT = "%(asctime)s %(name)s %(message)s"


def version() -> str:
    """The installed kvscale distribution's version (the router ships in it)."""
    try:
        return metadata.version("kvscale")
    except metadata.PackageNotFoundError:
        return "unknown"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str, log_format: str) -> None:
    """The root logger at `level`, writing `log_format` lines to stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
