"""The committed Helm chart is what charts/generate.py makes of manifests/ now: a change to
manifests/ without `make chart` fails here (the chart's rendering is tested in the control-plane
tier, with helm)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATE = ROOT / "charts" / "generate.py"
CHART = ROOT / "charts" / "kvscale"


def check(chart: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATE), "--check", "--chart", str(chart)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_committed_chart_is_the_generators_output() -> None:
    done = check(CHART)
    assert done.returncode == 0, done.stderr


def test_a_stale_or_hand_edited_chart_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "kvscale"
    shutil.copytree(CHART, copy)
    values = copy / "values.yaml"
    values.write_text(values.read_text().replace("scope: cluster", "scope: namespaced"))
    (copy / "templates" / "extra.yaml").write_text("{}\n")
    done = check(copy)
    assert done.returncode == 1, done.stderr
    assert "templates/extra.yaml, values.yaml" in done.stderr, done.stderr
