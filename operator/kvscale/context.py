"""What every endpoint's worker and loops share: API access, signal sources, metrics, the clock.

Its own module so that the worker and the loops it owns all import it, and none imports another
to learn its type.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvscale.api import v1alpha1 as api
from kvscale.api.images import DEFAULTS, DefaultImages
from kvscale.kube import Kube
from kvscale.operator_metrics import OperatorMetrics
from kvscale.signals.source import SignalSource


@dataclass(frozen=True)
class Context:
    kube: Kube
    source: Callable[[api.SignalsSpec], SignalSource]
    metrics: OperatorMetrics
    clock: Callable[[], float] = time.time
    images: DefaultImages = DEFAULTS  # for endpoints that pin no image
