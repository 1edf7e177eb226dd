"""Render kvscale-endpoints.json, the Grafana dashboard for LLM endpoints, from the panels below.

Engine panels read the recording rules (manifests/prometheus/recording-rules.yaml) and the
engines' own series; control panels read the operator's kvscale_operator_* metrics. Run `python
manifests/components/grafana/render.py` after editing; `--check` exits 1 when the committed JSON
is stale (a unit test runs it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parent / "kvscale-endpoints.json"
S = 'namespace="$namespace", endpoint=~"$endpoint"'  # endpoint-level series
R = 'namespace="$namespace", kvscale_io_endpoint=~"$endpoint"'  # the engines' own series
Target = tuple[str, str]  # expr, legend


def _targets(targets: list[Target]) -> list[dict[str, Any]]:
    return [
        {
            "refId": chr(ord("A") + i),
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "expr": expr,
            "legendFormat": legend,
        }
        for i, (expr, legend) in enumerate(targets)
    ]


def panel(title: str, unit: str, targets: list[Target], description: str = "") -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"fillOpacity": 10}}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": _targets(targets),
    }


def stat(title: str, unit: str, targets: list[Target], mappings: list[Any] | None = None) -> Any:
    return {
        "type": "stat",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit, "mappings": mappings or []}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"},
        "targets": _targets(targets),
    }


def _yes_no(yes: str, no: str) -> list[Any]:
    return [{"type": "value", "options": {"0": {"text": no}, "1": {"text": yes}}}]


OVERVIEW = [
    stat(
        "Replicas ready / desired",
        "none",
        [
            (f"sum(kvscale_operator_ready_replicas{{{S}}})", "ready"),
            (f"sum(kvscale_operator_desired_replicas{{{S}}})", "desired"),
        ],
    ),
    stat("p99 TTFT", "s", [(f"max(kvscale_endpoint:ttft_seconds:p99_rate1m{{{S}}})", "p99")]),
    stat("Tokens/s served", "short", [(f"sum(kvscale_endpoint:tokens:rate1m{{{S}}})", "tok/s")]),
    stat(
        "Cost per successful request",
        "none",
        [(f"avg(kvscale_operator_cost_per_successful_request{{{S}}})", "cost")],
    ),
    stat(
        "Metrics available",
        "none",
        [(f"min(kvscale_operator_metrics_available{{{S}}})", "metrics")],
        _yes_no("yes", "NO"),
    ),
    stat(
        "Capacity limited",
        "none",
        [(f"max(kvscale_operator_capacity_limited{{{S}}})", "limited")],
        _yes_no("YES", "no"),
    ),
]

ROWS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "Demand and capacity",
        [
            panel(
                "Demand vs capacity",
                "short",
                [
                    (
                        f"sum by (endpoint) (kvscale_operator_demand_tokens_per_second{{{S}}})",
                        "{{endpoint}} demand",
                    ),
                    (
                        f"sum by (endpoint) (kvscale_operator_forecast_tokens_per_second{{{S}}})",
                        "{{endpoint}} forecast",
                    ),
                    (
                        "sum by (endpoint) ("
                        f"kvscale_operator_replica_capacity_tokens_per_second{{{S}}}"
                        f" * on (namespace, endpoint) kvscale_operator_ready_replicas{{{S}}})",
                        "{{endpoint}} capacity of ready replicas",
                    ),
                    (
                        f"sum by (endpoint) (kvscale_endpoint:tokens:rate1m{{{S}}})",
                        "{{endpoint}} served (engines)",
                    ),
                ],
                "Tokens per second (prompt + generated): the demand and forecast the capacity "
                "loop sees, what the ready replicas can carry, and what the engines served.",
            ),
            panel(
                "Replicas",
                "none",
                [
                    (
                        f"sum by (endpoint) (kvscale_operator_desired_replicas{{{S}}})",
                        "{{endpoint}} desired",
                    ),
                    (
                        f"sum by (endpoint) (kvscale_operator_ready_replicas{{{S}}})",
                        "{{endpoint}} ready",
                    ),
                    (
                        f"sum by (endpoint) (kvscale_operator_max_replicas{{{S}}})",
                        "{{endpoint}} max",
                    ),
                    (
                        f"count by (kvscale_io_endpoint) (vllm:num_requests_running{{{R}}})",
                        "{{kvscale_io_endpoint}} engines scraped",
                    ),
                ],
            ),
            panel(
                "Routing weights",
                "percentunit",
                [
                    (f"kvscale_operator_routing_weight{{{S}}}", "{{endpoint}} {{pod}} published"),
                    (
                        "max by (kvscale_io_endpoint, replica) "
                        f"(kvscale_router_replica_weight{{{R}}})",
                        "{{kvscale_io_endpoint}} {{replica}} as routed",
                    ),
                ],
                "Each replica's weight as the operator publishes it and as the routers apply it "
                "(0 while warming up or draining).",
            ),
            panel(
                "Scaling decisions (per 5 min)",
                "none",
                [
                    (
                        "sum by (endpoint, reason) "
                        f"(increase(kvscale_operator_scaling_decisions_total{{{S}}}[5m]))",
                        "{{endpoint}} {{reason}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Latency vs SLO",
        [
            panel(
                "Time to first token vs SLO",
                "s",
                [
                    (f"kvscale_endpoint:ttft_seconds:p99_rate1m{{{S}}}", "{{endpoint}} p99"),
                    (f"kvscale_endpoint:ttft_seconds:p50_rate1m{{{S}}}", "{{endpoint}} p50"),
                    (
                        f"max by (endpoint) (kvscale_endpoint:slo_ttft_seconds{{{S}}})",
                        "{{endpoint}} SLO",
                    ),
                ],
            ),
            panel(
                "Inter-token latency vs SLO",
                "s",
                [
                    (f"kvscale_endpoint:itl_seconds:p99_rate1m{{{S}}}", "{{endpoint}} p99"),
                    (f"kvscale_endpoint:itl_seconds:p50_rate1m{{{S}}}", "{{endpoint}} p50"),
                    (
                        f"max by (endpoint) (kvscale_endpoint:slo_itl_seconds{{{S}}})",
                        "{{endpoint}} SLO",
                    ),
                ],
            ),
            panel(
                "Good share (SLI)",
                "percentunit",
                [
                    (
                        f"1 - kvscale_endpoint:slo_bad_share:ratio_rate5m{{{S}}}",
                        "{{endpoint}} good {{sli}} (5 min)",
                    ),
                    (f"kvscale_endpoint:slo_good_share_target{{{S}}}", "{{endpoint}} target"),
                    (
                        f"kvscale_operator_slo_interval_attainment_ratio{{{S}}}",
                        "{{endpoint}} intervals within the p99 targets (operator)",
                    ),
                ],
                "Good requests: answered (not refused, not failed) with the first token within "
                "the TTFT target; good token intervals: within the ITL target. The operator's "
                "line is another measure, status.slo's: the share of capacity intervals whose "
                "p99s met the targets.",
            ),
            panel(
                "Error budget burn rate (1 h)",
                "none",
                [
                    (
                        f"kvscale_endpoint:slo_bad_share:ratio_rate1h{{{S}}}"
                        " / on (namespace, endpoint) group_left ()"
                        f" (1 - kvscale_endpoint:slo_good_share_target{{{S}}})",
                        "{{endpoint}} {{sli}}",
                    )
                ],
                "1 spends the error budget exactly over the SLO period; the fast-burn alert "
                "pages at 14.4.",
            ),
        ],
    ),
    (
        "Engines",
        [
            panel(
                "KV cache usage",
                "percentunit",
                [
                    (f"kvscale_endpoint:kv_cache_usage:max{{{S}}}", "{{endpoint}} fullest replica"),
                    (f"kvscale_endpoint:kv_cache_usage:avg{{{S}}}", "{{endpoint}} mean"),
                    (f"vllm:kv_cache_usage_perc{{{R}}}", "{{pod}}"),
                ],
            ),
            panel(
                "Queue",
                "none",
                [
                    (f"kvscale_endpoint:requests_running:sum{{{S}}}", "{{endpoint}} running"),
                    (f"kvscale_endpoint:requests_waiting:sum{{{S}}}", "{{endpoint}} waiting"),
                    (
                        f"kvscale_endpoint:router_pending_requests:sum{{{S}}}",
                        "{{endpoint}} held by the routers",
                    ),
                ],
            ),
            panel(
                "Preemptions",
                "short",
                [(f"kvscale_endpoint:preemptions:rate1m{{{S}}}", "{{endpoint}} preemptions/s")],
            ),
            panel(
                "Refusals",
                "short",
                [
                    (f"kvscale_endpoint:refusals:rate1m{{{S}}}", "{{endpoint}} refusals/s"),
                    (
                        "sum by (kvscale_io_endpoint, reason, traffic_class) "
                        f"(rate(kvscale_engine_admission_rejections_total{{{R}}}[1m]))",
                        "{{kvscale_io_endpoint}} {{traffic_class}} {{reason}}",
                    ),
                ],
                "Requests refused by admission control (429/503); draining refusals are left "
                "out of the endpoint total.",
            ),
            panel(
                "Throughput",
                "short",
                [
                    (f"kvscale_endpoint:prompt_tokens:rate1m{{{S}}}", "{{endpoint}} prompt tok/s"),
                    (
                        f"kvscale_endpoint:generation_tokens:rate1m{{{S}}}",
                        "{{endpoint}} generated tok/s",
                    ),
                    (f"kvscale_endpoint:successes:rate1m{{{S}}}", "{{endpoint}} successes/s"),
                ],
            ),
            panel(
                "Prefix cache hit rate",
                "percentunit",
                [(f"kvscale_endpoint:prefix_cache_hits:ratio_rate1m{{{S}}}", "{{endpoint}}")],
                "Share of prompt tokens served from the prefix cache.",
            ),
        ],
    ),
    (
        "Router",
        [
            panel(
                "Requests by status",
                "reqps",
                [
                    (
                        "sum by (kvscale_io_endpoint, code) "
                        f"(rate(kvscale_router_requests_total{{{R}}}[1m]))",
                        "{{kvscale_io_endpoint}} {{code}}",
                    )
                ],
                "What clients got from the endpoint's Service, by HTTP status.",
            ),
            panel(
                "Router added latency",
                "s",
                [
                    (
                        "histogram_quantile(0.99, sum by (kvscale_io_endpoint, le) "
                        f"(rate(kvscale_router_added_latency_seconds_bucket{{{R}}}[1m])))",
                        "{{kvscale_io_endpoint}} p99",
                    ),
                    (
                        "histogram_quantile(0.5, sum by (kvscale_io_endpoint, le) "
                        f"(rate(kvscale_router_added_latency_seconds_bucket{{{R}}}[1m])))",
                        "{{kvscale_io_endpoint}} p50",
                    ),
                ],
                "Time the router adds before a request reaches a replica, plus relaying its "
                "first byte (queueing and holding excluded).",
            ),
        ],
    ),
    (
        "Cost",
        [
            panel(
                "Cost per successful request",
                "none",
                [(f"kvscale_operator_cost_per_successful_request{{{S}}}", "{{endpoint}}")],
                "In the endpoint's spec.cost.currency.",
            ),
            panel(
                "GPUs in use",
                "none",
                [
                    (
                        f"sum by (endpoint) (rate(kvscale_operator_gpu_seconds_total{{{S}}}[5m]))",
                        "{{endpoint}}",
                    )
                ],
                "GPU-seconds accrued per second: the GPUs the endpoint's replicas hold.",
            ),
        ],
    ),
]


def _layout() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    y = 0
    for i, item in enumerate(OVERVIEW):
        panels.append({**item, "gridPos": {"x": 4 * i, "y": y, "w": 4, "h": 4}})
    y += 4
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})  # fmt: skip
        y += 1
        for i, item in enumerate(row):
            panels.append(
                {**item, "gridPos": {"x": 12 * (i % 2), "y": y + 8 * (i // 2), "w": 12, "h": 8}}
            )
        y += 8 * ((len(row) + 1) // 2)
    for number, item in enumerate(panels, start=1):
        item["id"] = number
    return panels


def _variable(name: str, label: str, query: str, multi: bool) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-query"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "allValue": ".*" if multi else None,
    }


def dashboard() -> dict[str, Any]:
    engines = 'vllm:num_requests_running{kvscale_io_endpoint!=""}'
    return {
        "uid": "kvscale-endpoints",
        "title": "kvscale / LLM endpoints",
        "description": "Demand, capacity, replicas, routing, latency against the SLO, KV cache, "
        "preemptions, refusals and cost of kvscale LLMEndpoints.",
        "tags": ["kvscale", "llm"],
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {
            "list": [
                {
                    "type": "datasource",
                    "name": "datasource",
                    "label": "Prometheus",
                    "query": "prometheus",
                },
                _variable("namespace", "Namespace", f"label_values({engines}, namespace)", False),
                _variable(
                    "endpoint",
                    "Endpoint",
                    'label_values(vllm:num_requests_running{namespace="$namespace", '
                    'kvscale_io_endpoint!=""}, kvscale_io_endpoint)',
                    True,
                ),
            ]
        },
        "panels": _layout(),
    }


def main(argv: list[str]) -> int:
    text = json.dumps(dashboard(), indent=2) + "\n"
    if "--check" in argv:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__)}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
