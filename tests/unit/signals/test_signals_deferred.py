"""The routers' deferred queue reaches the snapshot: parsed, summed over routers, rated."""

from __future__ import annotations

import math
from typing import Any

from metrics_farm import farm

from kvscale.controllers.deferred import required_tokens_per_s
from kvscale.signals.deferred import backlogs, parse_router
from kvscale.signals.direct import DirectScrape
from kvscale.signals.prometheus import Queries, deferred_from_vectors
from kvscale.signals.source import PodAddress, Target


def router_text(held: int, due_300: float, due_all: float, spare: float, met: int) -> str:
    return f"""# TYPE kvscale_router_pending_requests gauge
kvscale_router_pending_requests 0
# TYPE kvscale_router_deferred_queue_requests gauge
kvscale_router_deferred_queue_requests{{traffic_class="batch"}} {held}
# TYPE kvscale_router_deferred_queue_tokens gauge
kvscale_router_deferred_queue_tokens{{traffic_class="batch",due_within="60"}} 0
kvscale_router_deferred_queue_tokens{{traffic_class="batch",due_within="300"}} {due_300}
kvscale_router_deferred_queue_tokens{{traffic_class="batch",due_within="3600"}} {due_all}
kvscale_router_deferred_queue_tokens{{traffic_class="batch",due_within="+Inf"}} {due_all}
# TYPE kvscale_router_deferred_oldest_age_seconds gauge
kvscale_router_deferred_oldest_age_seconds{{traffic_class="batch"}} 42
# TYPE kvscale_router_deferred_served_tokens counter
kvscale_router_deferred_served_tokens_total{{traffic_class="batch",release="spare"}} {spare}
kvscale_router_deferred_served_tokens_total{{traffic_class="batch",release="deadline"}} 100
# TYPE kvscale_router_deferred_completed counter
kvscale_router_deferred_completed_total{{traffic_class="batch",outcome="met"}} {met}
kvscale_router_deferred_completed_total{{traffic_class="batch",outcome="missed"}} 1
"""


def test_two_readings_of_two_routers_sum_and_rate() -> None:
    a0, a1 = (
        parse_router(router_text(2, 0, 10, 0, 0), 0),
        parse_router(router_text(3, 30, 600, 6000, 9), 60),
    )
    b1 = parse_router(router_text(1, 0, 60, 600, 0), 60)
    (batch,) = backlogs([a1, b1], [a0, None])  # b has no earlier reading: no rate from it
    assert batch.traffic_class == "batch" and batch.requests == 4 and batch.oldest_age_s == 42
    assert batch.due == ((60.0, 0.0), (300.0, 30.0), (3600.0, 660.0), (math.inf, 660.0))
    assert batch.tokens == 660
    assert batch.valley_tokens_per_s == 100 and batch.served_tokens_per_s == 100
    assert batch.met_per_s == 9 / 60 and batch.deadline_attainment == 1.0  # missed: 1 -> 1
    assert required_tokens_per_s([batch]) == max(30 / 300, 660 / 3600)


def test_a_router_without_deferrable_classes_has_no_backlog() -> None:
    plain = parse_router(
        "# TYPE kvscale_router_pending_requests gauge\nkvscale_router_pending_requests 2\n", 0
    )
    assert backlogs([plain], [None]) == ()


async def test_the_direct_scrape_reads_the_routers_deferred_queue() -> None:
    async with farm("router-0") as routers, DirectScrape() as source:
        router = routers["router-0"]
        router.text = router_text(5, 3000, 9000, 0, 0)
        tgt = Target("ns", "llama", 60, 60, (), (router.address,))
        snap = await source.snapshot(tgt, 0.0)
        assert snap.ok and snap.deferred_tokens == 9000
        assert snap.deferred[0].requests == 5 and snap.deferred_served_tokens_per_s == 0


def test_the_prometheus_queries_and_their_answers() -> None:
    tgt = Target("ns", "llama", 60, 60, (), (PodAddress("router-0", "10.0.0.1", 8000),))
    texts = Queries(tgt).deferred()
    assert (
        'sum by (traffic_class, due_within) (kvscale_router_deferred_queue_tokens{namespace="ns"'
        in texts["tokens"]
    )
    assert "rate(kvscale_router_deferred_served_tokens_total{" in texts["served"]

    def vector(*rows: tuple[dict[str, str], float]) -> list[dict[str, Any]]:
        return [{"metric": m, "value": [0, str(v)]} for m, v in rows]

    got = {
        "requests": vector(({"traffic_class": "batch"}, 3)),
        "oldest": vector(({"traffic_class": "batch"}, 12)),
        "tokens": vector(
            ({"traffic_class": "batch", "due_within": "+Inf"}, 900),
            ({"traffic_class": "batch", "due_within": "600"}, 300),
        ),
        "served": vector(({"traffic_class": "batch", "release": "spare"}, 5)),
        "completed": vector(({"traffic_class": "batch", "outcome": "missed"}, 0.5)),
    }
    (batch,) = deferred_from_vectors(got)
    assert batch.due == ((600.0, 300.0), (math.inf, 900.0))
    assert (batch.requests, batch.oldest_age_s, batch.valley_tokens_per_s) == (3, 12, 5)
    assert batch.deadline_attainment == 0.0
