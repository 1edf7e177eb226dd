"""The signal sources an operator holds: one direct scraper, one Prometheus client per URL.

Both are created on first use inside the operator's event loop and closed at shutdown.
"""

from __future__ import annotations

from kvscale.api import v1alpha1 as api
from kvscale.signals.direct import DirectScrape
from kvscale.signals.source import SignalSource

SCRAPE_TIMEOUT_S = 2.0


class Sources:
    def __init__(self) -> None:
        self._direct: DirectScrape | None = None
        self._prometheus: dict[str, SignalSource] = {}

    def __call__(self, signals: api.SignalsSpec) -> SignalSource:
        if signals.source == "prometheus" and signals.prometheus_url:
            url = signals.prometheus_url
            if url not in self._prometheus:
                from kvscale.signals.prometheus import PrometheusSource

                self._prometheus[url] = PrometheusSource(url)
            return self._prometheus[url]
        if self._direct is None:
            # a dead replica must not hold a routing tick (3 s by default) for long
            self._direct = DirectScrape(timeout_s=SCRAPE_TIMEOUT_S)
        return self._direct

    async def aclose(self) -> None:
        for source in [self._direct, *self._prometheus.values()]:
            if source is not None:
                await source.aclose()
