"""Every PromQL expression in kvscale's Grafana dashboard, ready to run against a Prometheus.

Panel targets (also inside rows) and the query variables (``label_values(selector, label)``
becomes ``selector``), with the dashboard's variables replaced by the values given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscale_cluster.install import ROOT

DASHBOARD = ROOT / "manifests" / "components" / "grafana" / "kvscale-endpoints.json"
LABEL_VALUES = re.compile(r"^label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)$", re.DOTALL)
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Query:
    """One expression and where it sits (panel title and legend, or the variable's name)."""

    where: str
    expr: str


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every PromQL expression of ``dashboard``, variables left as written."""
    found: list[Query] = []
    for panel in _panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            where = f"{panel['title']} / {target.get('legendFormat', target['refId'])}"
            found.append(Query(where, target["expr"]))
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = LABEL_VALUES.match(text.strip())
        found.append(Query(f"variable {variable['name']}", match.group(1) if match else text))
    return found


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with ``$name`` and ``${name}`` replaced; an unknown variable is an error."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"No value for dashboard variable ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(replace, expr)


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard
