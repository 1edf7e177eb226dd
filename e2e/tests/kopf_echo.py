"""A minimal Kopf operator for testing ``run_operator``: annotates labelled ConfigMaps."""

from __future__ import annotations

from typing import Any

import kopf


@kopf.on.create("configmaps", labels={"kvscale.io/echo": "yes"})
def echo(name: str, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
    patch.metadata.annotations["kvscale.io/echoed"] = name
    logger.info(f"Echoed configmap {name}")
