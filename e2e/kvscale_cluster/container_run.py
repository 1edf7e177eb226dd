"""One container of a pod as a process group: start, exit and restart bookkeeping, graceful
stop, and its entry in the pod's ``containerStatuses``."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cpu_quota import CpuQuotas
from .kube_api import Obj
from .netns import PodAddress
from .nodes import now_iso
from .probes import ProbeState, run_action
from .process import signal_group

MAX_BACKOFF = 30.0
PROBE_KINDS = ("startup", "liveness", "readiness")


def exit_code(returncode: int) -> int:
    """A shell-style exit code: death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def terminated(code: int, started_at: str) -> Obj:
    return {
        "terminated": {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": now_iso(),
        }
    }


@dataclass
class ContainerRun:
    """A container and its current process (None between runs)."""

    spec: Obj
    argv: list[str]
    env: dict[str, str]
    log: Path
    init: bool = False
    cgroup: Path | None = None  # its CPU limit's cgroup (cpu_quota.py), where one is enforced
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    started_at: str = ""
    started_mono: float = 0.0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    done: bool = False
    exit_code: int | None = None
    next_start: float = 0.0
    backoff: float = 1.0
    probes: dict[str, ProbeState] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def succeeded(self) -> bool:
        return self.done and self.exit_code == 0

    def start(self, address: PodAddress, default_cwd: Path, now: float) -> None:
        """Start the process in the pod's namespace, in its own process group."""
        workdir = self.spec.get("workingDir")
        cwd = Path(workdir) if workdir and Path(workdir).is_dir() else default_cwd
        argv = address.wrap(self.argv)
        if self.cgroup is not None:
            argv = CpuQuotas.join_argv(self.cgroup, argv)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=cwd,
                start_new_session=True,
            )
        self.starts += 1
        self.started_at, self.started_mono = now_iso(), now
        self.state = {"running": {"startedAt": self.started_at}}
        self.ready = False
        self.probes = {
            kind: ProbeState(spec=self.spec[f"{kind}Probe"], started=now)
            for kind in PROBE_KINDS
            if self.spec.get(f"{kind}Probe")
        }

    def exited(self, code: int, restart_policy: str, now: float) -> str | None:
        """Record an exit; schedule a restart when the policy says so and return its back-off
        message (None when the container is done)."""
        self.proc, self.ready, self.exit_code = None, False, code
        if self.init:  # init containers restart only on failure, and never under Never
            restart = code != 0 and restart_policy != "Never"
        else:
            restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
        if not restart:
            self.state, self.done = terminated(code, self.started_at), True
            return None
        if now - self.started_mono > 60:  # it ran a while: forget earlier crashes
            self.backoff = 1.0
        self.last_state = terminated(code, self.started_at)
        message = f"back-off {self.backoff:.0f}s restarting failed container={self.name}"
        self.state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
        self.next_start = now + self.backoff
        self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        return message

    def stopped(self) -> None:
        """Record the end of a process stopped by the kubelet (pod deletion)."""
        if self.proc is not None:
            code = exit_code(self.proc.returncode)
            self.state, self.exit_code = terminated(code, self.started_at), code
        self.proc, self.done, self.ready = None, True, False

    def status(self) -> Obj:
        image = self.spec.get("image", "")
        return {
            "name": self.name,
            "image": image,
            "imageID": f"kvscale-process://{image}",
            "containerID": f"kvscale-process://{self.proc.pid}" if self.proc else "",
            "ready": self.ready,
            "started": self.running,
            "restartCount": max(0, self.starts - 1),
            "state": self.state,
            "lastState": self.last_state,
        }


def waiting_status(spec: Obj, reason: str, message: str) -> Obj:
    """The status of a container that could not be created (ErrImagePull and the like)."""
    return {
        "name": spec["name"],
        "image": spec.get("image", ""),
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": message}},
        "lastState": {},
    }


def stop_runs(runs: list[ContainerRun], address: PodAddress | None, grace: float) -> None:
    """preStop hooks, then SIGTERM to each process group, SIGKILL after ``grace`` seconds."""
    deadline = time.monotonic() + grace
    live = [r for r in runs if r.running]
    for run in live:
        hook = (run.spec.get("lifecycle") or {}).get("preStop")
        if hook and address is not None:
            run_action(hook, run.spec, address, run.env, max(0.0, deadline - time.monotonic()))
    for run in live:
        assert run.proc is not None
        signal_group(run.proc.pid, signal.SIGTERM)
    while any(r.running for r in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    for run in live:
        assert run.proc is not None
        if run.proc.poll() is None:
            signal_group(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
