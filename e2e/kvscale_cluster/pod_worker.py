"""One thread per pod: the pod's network namespace, its containers as process groups, probes,
restarts, truthful status, and graceful termination ending in the deletion's confirmation.

Volume mounts are not remapped: a process sees the host's file system, so a hostPath volume
works when the manifest mounts it at the same path it names on the host.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from . import images
from .kube_api import ApiError, KubeApi, Obj
from .kubeconfig import write_kubeconfig
from .netns import PodAddress, PodNetwork
from .nodes import now_iso
from .pod_env import EnvError, container_env, expand_argv
from .probes import ProbeState, run_action
from .process import signal_group

log = logging.getLogger("kvscale.kubelet")
MAX_BACKOFF = 30.0
TOKEN_SECONDS = 86400


@dataclass
class PodContext:
    """What every pod worker shares with the kubelet."""

    api: KubeApi
    network: PodNetwork
    network_lock: threading.Lock
    state_dir: Path
    pod_logs: Path


@dataclass
class ContainerRun:
    """One container of the pod and its current process."""

    spec: Obj
    argv: list[str]
    env: dict[str, str]
    log: Path
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
    init: bool = False

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


class PodWorker(threading.Thread):
    """Runs one pod until it is deleted (or the kubelet stops)."""

    def __init__(self, ctx: PodContext, pod: Obj) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}-{meta['name']}", daemon=True)
        self.ctx = ctx
        self.api = ctx.api.clone()
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.dir = ctx.state_dir / "pods" / self.uid
        self._latest = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._gone = False
        self._shutdown = False
        self.address: PodAddress | None = None
        self.inits: list[ContainerRun] = []  # init containers, run in order to completion
        self.runs: list[ContainerRun] = []
        self._waiting: tuple[str, str] | None = None  # (reason, message) before containers run
        self._sent: Obj | None = None
        self._transitions: dict[str, tuple[str, str]] = {}
        self._start_time = now_iso()

    # -- called by the kubelet's sync loop
    def update(self, pod: Obj) -> None:
        with self._lock:
            self._latest = pod
        self._wake.set()

    def vanish(self) -> None:
        self._gone = True
        self._wake.set()

    def shutdown(self) -> None:
        self._shutdown = True
        self._wake.set()

    @property
    def pod(self) -> Obj:
        with self._lock:
            return self._latest

    # -- life of the pod
    def run(self) -> None:
        try:
            self._live()
        except Exception:
            log.exception("Pod %s/%s worker failed", self.namespace, self.pod_name)
            self._kill_all(grace=2.0)
        finally:
            self._release_network()
            self.api.close()

    def _live(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._prepare():
            self._idle_until_deleted()
            return
        log.info("Started pod %s/%s at %s", self.namespace, self.pod_name, self._ip)
        while True:
            if self._shutdown:
                self._kill_all(grace=5.0)
                return
            if self._gone:
                self._kill_all(grace=0.0)
                return
            pod = self.pod
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod)
                return
            now = time.monotonic()
            if not self._initializing(pod, now):
                for run in self.runs:
                    self._tick(run, pod, now)
            self._publish()
            if self._phase() in ("Succeeded", "Failed"):
                self._release_network()
                self._idle_until_deleted()
                return
            self._wake.wait(0.25)
            self._wake.clear()

    def _initializing(self, pod: Obj, now: float) -> bool:
        """Advance the init containers; True until all of them have succeeded."""
        for run in self.inits:
            if run.done and run.exit_code == 0:
                continue
            if not run.done:
                self._tick(run, pod, now)
            return True
        return False

    def _idle_until_deleted(self) -> None:
        """A pod that cannot run (or has finished) waits for its deletion and confirms it."""
        while not (self._gone or self._shutdown):
            self._publish()
            if self.pod["metadata"].get("deletionTimestamp"):
                self._confirm_deletion()
                return
            self._wake.wait(1.0)
            self._wake.clear()

    @property
    def _ip(self) -> str:
        return self.address.ip if self.address else ""

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        """Record a core/v1 Event on the pod, as the kubelet does (failures are only logged)."""
        now = now_iso()
        node = self.pod["spec"].get("nodeName", "")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.pod_name}.{secrets.token_hex(8)}"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.pod_name,
                "namespace": self.namespace,
                "uid": self.uid,
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": node},
            "reportingComponent": "kubelet",
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.post(f"/api/v1/namespaces/{self.namespace}/events", event)
        except (ApiError, httpx.HTTPError) as error:
            log.warning(
                "Event %s on %s/%s not recorded: %s", reason, self.namespace, self.pod_name, error
            )

    # -- preparing: image, network, credentials, environment
    def _prepare(self) -> bool:
        pod = self.pod
        inits = pod["spec"].get("initContainers") or []
        containers = [*inits, *pod["spec"]["containers"]]
        try:
            bases = [images.container_argv(c) for c in containers]
        except images.ImageError as error:
            self._waiting = ("ErrImagePull", str(error))
            log.info("Refused pod %s/%s: %s", self.namespace, self.pod_name, error)
            self._event("Failed", str(error), "Warning")
            return False
        with self.ctx.network_lock:
            self.address = self.ctx.network.attach()
        while True:
            try:
                base_env = self._base_env(pod)
                envs = [
                    container_env(self.api, pod, c, base_env, self._ip, self.ctx.network.host_ip)
                    for c in containers
                ]
                break
            except (EnvError, ApiError, httpx.HTTPError) as error:
                if self._waiting is None:
                    self._event("Failed", f"Error: {error}", "Warning")
                self._waiting = ("CreateContainerConfigError", str(error))
                self._publish()
                if self._wake.wait(2.0) or self._gone or self._shutdown:
                    self._wake.clear()
                if self._gone or self._shutdown or pod["metadata"].get("deletionTimestamp"):
                    return False
                pod = self.pod
        self._waiting = None
        self.ctx.pod_logs.mkdir(parents=True, exist_ok=True)
        for index, (spec, argv, env) in enumerate(zip(containers, bases, envs, strict=True)):
            logfile = self.ctx.pod_logs / f"{self.namespace}_{self.pod_name}_{spec['name']}.log"
            run = ContainerRun(
                spec=spec,
                argv=expand_argv(argv, env),
                env=env,
                log=logfile,
                init=index < len(inits),
            )
            if inits and not run.init:
                run.state = {"waiting": {"reason": "PodInitializing"}}
            (self.inits if run.init else self.runs).append(run)
        return True

    def _base_env(self, pod: Obj) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["PATH"] = f"{images.VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
        env["HOSTNAME"] = self.pod_name
        env["PYTHONUNBUFFERED"] = "1"
        server = urlsplit(self.api.server)
        env["KUBERNETES_SERVICE_HOST"] = server.hostname or ""
        env["KUBERNETES_SERVICE_PORT"] = str(server.port or 443)
        env["KUBERNETES_SERVICE_PORT_HTTPS"] = env["KUBERNETES_SERVICE_PORT"]
        kubeconfig = self._pod_kubeconfig(pod)
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    def _pod_kubeconfig(self, pod: Obj) -> Path | None:
        """A kubeconfig holding a TokenRequest token bound to this pod and its service account
        (a plain process cannot have /var/run/secrets mounted)."""
        spec = pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        account = spec.get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.pod_name,
                    "uid": self.uid,
                },
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token"
        token = self.api.post(path, request)["status"]["token"]
        secrets = self.dir / "serviceaccount"
        secrets.mkdir(parents=True, exist_ok=True)
        (secrets / "token").write_text(token)
        (secrets / "namespace").write_text(self.namespace)
        user = f"system:serviceaccount:{self.namespace}:{account}"
        return write_kubeconfig(
            self.dir / "kubeconfig",
            self.api.server,
            Path(self.api.ca_path),
            token,
            user,
            namespace=self.namespace,
        )

    # -- running containers
    def _start(self, run: ContainerRun, now: float) -> None:
        assert self.address is not None
        workdir = run.spec.get("workingDir")
        cwd = Path(workdir) if workdir and Path(workdir).is_dir() else self.dir
        with run.log.open("ab") as out:
            run.proc = subprocess.Popen(
                self.address.wrap(run.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=run.env,
                cwd=cwd,
                start_new_session=True,
            )
        run.starts += 1
        run.started_at, run.started_mono = now_iso(), now
        run.state = {"running": {"startedAt": run.started_at}}
        run.ready = False
        run.probes = {
            kind: ProbeState(spec=run.spec[f"{kind}Probe"], started=now)
            for kind in ("startup", "liveness", "readiness")
            if run.spec.get(f"{kind}Probe")
        }
        log.info("Started container %s of %s/%s", run.name, self.namespace, self.pod_name)
        self._event("Started", f"Started container {run.name}")

    def _tick(self, run: ContainerRun, pod: Obj, now: float) -> None:
        if run.proc is None:
            if not run.done and now >= run.next_start:
                self._start(run, now)
            return
        code = run.proc.poll()
        if code is not None:
            self._exited(run, pod, _exit_code(code), now)
            return
        startup = run.probes.get("startup")
        if startup is not None and startup.result is not True:
            self._probe(run, startup, now)
            if startup.result is False:
                self._restart_unhealthy(run, "startup")
            return
        liveness = run.probes.get("liveness")
        if liveness is not None:
            self._probe(run, liveness, now)
            if liveness.result is False:
                self._restart_unhealthy(run, "liveness")
                return
        readiness = run.probes.get("readiness")
        if readiness is None:
            run.ready = True
        else:
            self._probe(run, readiness, now)
            run.ready = readiness.result is True

    def _probe(self, run: ContainerRun, probe: ProbeState, now: float) -> None:
        if not probe.due(now):
            return
        assert self.address is not None
        ok = run_action(probe.spec, run.spec, self.address, run.env, probe.timeout())
        probe.record(ok, time.monotonic())
        if not ok:
            kind = next(k for k, p in run.probes.items() if p is probe).capitalize()
            self._event("Unhealthy", f"{kind} probe failed for container {run.name}", "Warning")

    def _restart_unhealthy(self, run: ContainerRun, kind: str) -> None:
        log.info(
            "Container %s of %s/%s failed its %s probe; killing it",
            run.name,
            self.namespace,
            self.pod_name,
            kind,
        )
        grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        message = f"Container {run.name} failed {kind} probe, will be restarted"
        self._event("Killing", message)
        self._stop_runs([run], grace)

    def _exited(self, run: ContainerRun, pod: Obj, code: int, now: float) -> None:
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": now_iso(),
        }
        run.proc, run.ready, run.exit_code = None, False, code
        policy = pod["spec"].get("restartPolicy", "Always")
        if run.init:  # init containers restart only on failure, and never under Never
            restart = code != 0 and policy != "Never"
        else:
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if restart:
            if now - run.started_mono > 60:
                run.backoff = 1.0
            run.last_state = {"terminated": terminated}
            message = f"back-off {run.backoff:.0f}s restarting failed container={run.name}"
            run.state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            run.next_start = now + run.backoff
            self._event("BackOff", message, "Warning")
            run.backoff = min(run.backoff * 2, MAX_BACKOFF)
        else:
            run.state = {"terminated": terminated}
            run.done = True
        log.info(
            "Container %s of %s/%s exited with %d", run.name, self.namespace, self.pod_name, code
        )

    # -- stopping
    def _stop_runs(self, runs: list[ContainerRun], grace: float) -> None:
        """preStop hooks, then SIGTERM to each process group, SIGKILL after ``grace`` s."""
        deadline = time.monotonic() + grace
        live = [r for r in runs if r.running]
        for run in live:
            hook = (run.spec.get("lifecycle") or {}).get("preStop")
            if hook and self.address is not None:
                run_action(
                    hook, run.spec, self.address, run.env, max(0.0, deadline - time.monotonic())
                )
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

    def _kill_all(self, grace: float) -> None:
        self._stop_runs([*self.inits, *self.runs], grace)

    def _terminate(self, pod: Obj) -> None:
        meta = pod["metadata"]
        grace = float(
            meta.get("deletionGracePeriodSeconds")
            if meta.get("deletionGracePeriodSeconds") is not None
            else pod["spec"].get("terminationGracePeriodSeconds", 30)
        )
        log.info("Stopping pod %s/%s (grace %.0f s)", self.namespace, self.pod_name, grace)
        everything = [*self.inits, *self.runs]
        for run in everything:
            if run.running:
                self._event("Killing", f"Stopping container {run.name}")
        self._stop_runs(everything, grace)
        for run in everything:
            if run.proc is not None:
                code = _exit_code(run.proc.returncode)
                run.state = {
                    "terminated": {
                        "exitCode": code,
                        "reason": "Completed" if code == 0 else "Error",
                        "startedAt": run.started_at,
                        "finishedAt": now_iso(),
                    }
                }
                run.exit_code, run.proc, run.done, run.ready = code, None, True, False
            elif not run.done:
                run.done = True
        self._publish()
        self._release_network()
        self._confirm_deletion()

    def _confirm_deletion(self) -> None:
        """Delete the pod for good (grace 0, UID precondition), retrying while the API is busy."""
        while not self._gone:
            try:
                self._delete_now()
                return
            except httpx.HTTPError as error:
                log.warning("Deletion of %s/%s failed: %r", self.namespace, self.pod_name, error)
                self._wake.wait(1.0)

    def _delete_now(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            self.api.delete(f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}", body)
        except ApiError as error:
            if error.status not in (404, 409):
                raise
        log.info("Deleted pod %s/%s", self.namespace, self.pod_name)

    def _release_network(self) -> None:
        if self.address is not None:
            with self.ctx.network_lock:
                self.ctx.network.detach(self.address)
            self.address = None

    # -- status
    @property
    def _inits_done(self) -> bool:
        return all(r.done and r.exit_code == 0 for r in self.inits)

    def _phase(self) -> str:
        if any(r.done and r.exit_code != 0 for r in self.inits):
            return "Failed"
        if not self.runs or not self._inits_done:
            return "Pending"
        if all(r.done for r in self.runs):
            return "Succeeded" if all(r.exit_code == 0 for r in self.runs) else "Failed"
        return "Running" if any(r.starts for r in self.runs) else "Pending"

    def _condition(self, kind: str, ok: bool) -> Obj:
        status = "True" if ok else "False"
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            previous = (status, now_iso())
            self._transitions[kind] = previous
        return {"type": kind, "status": status, "lastTransitionTime": previous[1]}

    def _container_statuses(self, runs: list[ContainerRun], specs: list[Obj]) -> list[Obj]:
        if self._waiting is not None:
            reason, message = self._waiting
            return [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": reason, "message": message}},
                    "lastState": {},
                }
                for c in specs
            ]
        return [
            {
                "name": r.name,
                "image": r.spec.get("image", ""),
                "imageID": f"kvscale-process://{r.spec.get('image', '')}",
                "containerID": f"kvscale-process://{r.proc.pid}" if r.proc else "",
                "ready": r.ready,
                "started": r.running,
                "restartCount": r.restarts,
                "state": r.state,
                "lastState": r.last_state,
            }
            for r in runs
        ]

    def _status(self) -> Obj:
        ready = bool(self.runs) and all(r.ready for r in self.runs)
        status: Obj = {
            "phase": self._phase(),
            "hostIP": self.ctx.network.host_ip,
            "hostIPs": [{"ip": self.ctx.network.host_ip}],
            "startTime": self._start_time,
            "conditions": [
                self._condition("PodReadyToStartContainers", self.address is not None),
                self._condition("Initialized", self._inits_done),
                self._condition("ContainersReady", ready),
                self._condition("Ready", ready),
            ],
            "containerStatuses": self._container_statuses(
                self.runs, self.pod["spec"]["containers"]
            ),
        }
        if self.pod["spec"].get("initContainers"):
            status["initContainerStatuses"] = self._container_statuses(
                self.inits, self.pod["spec"]["initContainers"]
            )
        if self._waiting is not None:
            status["message"] = self._waiting[1]
            status["reason"] = self._waiting[0]
        if self.address is not None:
            status["podIP"] = self.address.ip
            status["podIPs"] = [{"ip": self.address.ip}]
        return status

    def _publish(self) -> None:
        """Patch the pod's status when it differs from what was last sent."""
        status = self._status()
        if status == self._sent:
            return
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}/status"
        body: Any = {"metadata": {"uid": self.uid}, "status": status}
        try:
            self.api.patch(path, body)
        except ApiError as error:
            if error.status == 404:
                self._gone = True
                return
            log.warning("Status of %s/%s not written: %s", self.namespace, self.pod_name, error)
            return
        except httpx.HTTPError as error:  # the API server is busy or restarting: next tick
            log.warning("Status of %s/%s not written: %r", self.namespace, self.pod_name, error)
            return
        self._sent = status
