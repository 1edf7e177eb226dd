"""Every tier reads traces from the committed sample (tests/data/traces) and never downloads one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TRACES_SAMPLE = Path(__file__).resolve().parent / "data" / "traces"


def pytest_configure(config: pytest.Config) -> None:
    os.environ["KVSCALE_TRACES_DIR"] = str(TRACES_SAMPLE)
    os.environ["KVSCALE_TRACES_MIRROR"] = "http://127.0.0.1:9"  # a download fails at once
