"""Signals: one typed snapshot per endpoint per tick, from a direct scrape or from Prometheus."""
