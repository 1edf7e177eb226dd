"""Child processes of the cluster: each in its own process group, logging to its own file,
stopped by PID (SIGTERM to the group, then SIGKILL after a grace period)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# e2e/, which holds this package: the harness is not in the wheel, so the components it starts
# with `python -m kvscale_cluster.<module>` (and the pods those start) find it on PYTHONPATH
HARNESS_PATH = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class Component:
    """A started component: its name, PID (also its process-group id) and log file."""

    name: str
    pid: int
    log: Path


def start(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Component:
    """Start ``argv`` in a new session (so a new process group), output appended to its log;
    ``env`` defaults to this process's, and the harness is on its PYTHONPATH."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=with_harness(os.environ if env is None else env),
            cwd=cwd,
            start_new_session=True,
        )
    return Component(name=name, pid=proc.pid, log=log)


def with_harness(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the harness's folder last on PYTHONPATH (where it is not there yet)."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if HARNESS_PATH in paths:
        return dict(env)
    return {**env, "PYTHONPATH": os.pathsep.join([*paths, HARNESS_PATH])}


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid`` (falling back to the process)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the group of ``pid``, wait up to ``grace`` seconds, then SIGKILL it."""
    if not alive(pid):
        _reap(pid)
        return
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not alive(pid):
            return
        time.sleep(0.05)
    signal_group(pid, signal.SIGKILL)
    while alive(pid):
        _reap(pid)
        time.sleep(0.02)


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    if not path.exists():
        return f"(no {path})"
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 200_000))
        text = handle.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])
