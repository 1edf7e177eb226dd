"""The `kvscale` CLI's tools: `loadtest`, `simulate`, `plan` (they need `kvscale[tools]`)."""

from __future__ import annotations

import argparse
from typing import Any


def tool_parser(
    subparsers: Any, name: str, summary: str, doc: str | None
) -> argparse.ArgumentParser:
    """`kvscale <name>`: `summary` in the CLI's list, the tool module's docstring, as written,
    under `--help`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=summary, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser
