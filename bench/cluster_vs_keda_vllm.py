"""kvscale against KEDA + the HPA on the local cluster, every replica a vLLM server.

`cluster_vs_keda` (bench/cluster_vs_keda.py) with vLLM as the engine, the path most adopters
take: the same Deployment shape, rendered by kvscale for `engine.kind: vllm` (vLLM's image, run
by the process kubelet from the venv `make vllm` builds; a missing venv fails this benchmark and
says how to build it), serving a seeded tiny Llama checkpoint (head_dim 64, vLLM's CPU minimum)
from the node. kvscale reads vLLM's own metrics; KEDA's trigger is the guides' own query on
`vllm:num_requests_waiting`. Both KEDA tunings run (the guides' and the one a user tries next).

A vLLM replica takes 1-3 minutes to start here alone and 3-4 beside a busy one, against seconds
for kvscale's engine, so the
demo's phases run `STRETCH` times as long (a burst that ends before a new replica could load
would compare nothing but start-up); their rates are scaled to one vLLM replica's capacity
measured first (the burst 1.5x it). Every answer runs to its 48 tokens (`ignore_eos`), and
kvscale's spec declares that capacity in tokens/s as vLLM's own counters counted it (the run in
bench/results, at 75fcbb4, counted the prompt with the checkpoint's tokenizer: 39 + 48 tokens).
Writes bench/results/cluster_vs_keda_vllm.json and its PNG. `--quick` shortens the phases to a
quarter of the demo's (no stretch): it checks the path, not the figures.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from bench.cluster_vs_keda import SETTLE_S, TUNINGS, compare
from kvscale_cluster import images
from kvscale_demo import versus
from kvscale_demo.__main__ import PHASES

PLOT = Path(__file__).parent / "results" / "cluster_vs_keda_vllm.png"
STRETCH = 3.0


def _checkpoint() -> Path:
    """The seeded checkpoint the vLLM spec serves (every run writes the same files)."""
    path = Path(versus.VLLM_CHECKPOINT)
    cli = [str(images.VENV_BIN / "kvscale-engine"), "tiny-checkpoint", "--vllm", str(path)]
    subprocess.run(cli, check=True, capture_output=True)
    return path


def run(quick: bool = False) -> dict[str, Any]:
    venv = Path(images.vllm_python(images.VLLM_REPOSITORY)).parent.parent  # fails without it
    _checkpoint()
    scale = 0.25 if quick else STRETCH
    phases = [versus.Phase(p.name, p.rate, p.seconds * scale) for p in PHASES]
    result = compare(
        lambda capacity: versus.scaled(phases, capacity),
        TUNINGS,
        SETTLE_S * max(1.0, scale / 2),
        PLOT,
        engine="vllm",
    )
    return result | {
        "vllm": (venv / ".installed-stamp").read_text().strip(),
        "stretch": scale,
    }
