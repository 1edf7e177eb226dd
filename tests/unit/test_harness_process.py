"""The harness is not installed: what it starts with `python -m kvscale_cluster.<module>` (the
kubelet, kube-proxy, pod discovery, and through the kubelet the testserver pods) finds it anyway."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kvscale_cluster import process
from kvscale_cluster.wait import wait_for


def test_a_component_imports_the_harness_with_no_pythonpath_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    code = "import kvscale_cluster; print(kvscale_cluster.__file__)"
    child = process.start("probe", [sys.executable, "-c", code], tmp_path)
    wait_for(lambda: not process.alive(child.pid), 30, "the probe to exit")
    expected = Path(process.HARNESS_PATH) / "kvscale_cluster" / "__init__.py"
    assert child.log.read_text().strip() == str(expected)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, [process.HARNESS_PATH]),
        ("", [process.HARNESS_PATH]),
        ("/a:/b", ["/a", "/b", process.HARNESS_PATH]),
        (f"/a:{process.HARNESS_PATH}", ["/a", process.HARNESS_PATH]),
    ],
)
def test_the_harness_goes_last_on_pythonpath_once(given: str | None, expected: list[str]) -> None:
    env = {"HOME": "/home/x"} if given is None else {"HOME": "/home/x", "PYTHONPATH": given}
    out = process.with_harness(env)
    assert out["PYTHONPATH"].split(os.pathsep) == expected
    assert out["HOME"] == "/home/x"
