"""One thread per pod: the pod's network namespace, its containers as process groups, probes,
restarts, truthful status, and graceful termination ending in the deletion's confirmation.

Volume mounts are not remapped: a process sees the host's file system, so a hostPath volume
works when the manifest mounts it at the same path it names on the host.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from . import images
from .container_run import ContainerRun, exit_code, stop_runs, waiting_status
from .cpu_quota import CpuQuotas, cpu_limit
from .events import record_event
from .kube_api import ApiError, KubeApi, Obj
from .netns import PodAddress, PodNetwork
from .nodes import now_iso
from .pod_credentials import base_env
from .pod_env import EnvError, container_env, expand_argv
from .probes import ProbeState, run_action

log = logging.getLogger("kvscale.kubelet")
TICK_SECONDS = 0.25


@dataclass
class PodContext:
    """What every pod worker shares with the kubelet."""

    api: KubeApi
    network: PodNetwork
    network_lock: threading.Lock
    state_dir: Path
    pod_logs: Path
    cpu_quotas: CpuQuotas | None = None  # CPU limits enforced (the kubelet's --cpu-cfs-quota)


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

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        record_event(self.api, self.pod, reason, message, kind)

    # -- life of the pod
    def run(self) -> None:
        try:
            self._live()
        except Exception:
            log.exception("Pod %s/%s worker failed", self.namespace, self.pod_name)
            stop_runs([*self.inits, *self.runs], self.address, 2.0)
        finally:
            self._release_network()
            self._release_cgroups()
            self.api.close()

    def _live(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._prepare():
            self._idle_until_deleted()
            return
        log.info("Started pod %s/%s at %s", self.namespace, self.pod_name, self.address)
        while True:
            if self._shutdown or self._gone:
                stop_runs([*self.inits, *self.runs], self.address, 5.0 if self._shutdown else 0)
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
            self._sleep(TICK_SECONDS)

    def _initializing(self, pod: Obj, now: float) -> bool:
        """Advance the init containers; True until all of them have succeeded."""
        for run in self.inits:
            if run.succeeded:
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
            self._sleep(1.0)

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
            self.address = self.ctx.network.attach(self.namespace)
        host_ip = self.ctx.network.host_ip
        while True:
            try:
                env = base_env(self.api, pod, self.dir)
                envs = [
                    container_env(self.api, pod, c, env, self.address.ip, host_ip)
                    for c in containers
                ]
                break
            except (EnvError, ApiError, httpx.HTTPError) as error:
                if self._waiting is None:
                    self._event("Failed", f"Error: {error}", "Warning")
                self._waiting = ("CreateContainerConfigError", str(error))
                self._publish()
                self._sleep(2.0)
                pod = self.pod
                if self._gone or self._shutdown or pod["metadata"].get("deletionTimestamp"):
                    return False
        self._waiting = None
        self.ctx.pod_logs.mkdir(parents=True, exist_ok=True)
        for index, (spec, argv, env) in enumerate(zip(containers, bases, envs, strict=True)):
            logfile = self.ctx.pod_logs / f"{self.namespace}_{self.pod_name}_{spec['name']}.log"
            run = ContainerRun(spec, expand_argv(argv, env), env, logfile, init=index < len(inits))
            cores = cpu_limit(spec)
            if self.ctx.cpu_quotas is not None and cores is not None:
                run.cgroup = self.ctx.cpu_quotas.create(f"{self.uid}-{run.name}", cores)
            if inits and not run.init:
                run.state = {"waiting": {"reason": "PodInitializing"}}
            (self.inits if run.init else self.runs).append(run)
        return True

    # -- running containers
    def _tick(self, run: ContainerRun, pod: Obj, now: float) -> None:
        assert self.address is not None
        if run.proc is None:
            if not run.done and now >= run.next_start:
                run.start(self.address, self.dir, now)
                log.info("Started container %s of %s/%s", run.name, self.namespace, self.pod_name)
                self._event("Started", f"Started container {run.name}")
            return
        code = run.proc.poll()
        if code is not None:
            self._exited(run, pod, exit_code(code), now)
            return
        startup = run.probes.get("startup")
        if startup is not None and startup.result is not True:
            self._probe(run, "startup", startup, now)
            return
        liveness = run.probes.get("liveness")
        if liveness is not None and not self._probe(run, "liveness", liveness, now):
            return
        readiness = run.probes.get("readiness")
        if readiness is None:
            run.ready = True
        else:
            self._probe(run, "readiness", readiness, now)
            run.ready = readiness.result is True

    def _probe(self, run: ContainerRun, kind: str, probe: ProbeState, now: float) -> bool:
        """Run ``probe`` when due; False when it failed for good and the container was killed
        (startup and liveness probes)."""
        if not probe.due(now):
            return True
        assert self.address is not None
        ok = run_action(probe.spec, run.spec, self.address, run.env, probe.timeout())
        probe.record(ok, time.monotonic())
        if not ok:
            message = f"{kind.capitalize()} probe failed for container {run.name}"
            self._event("Unhealthy", message, "Warning")
        if probe.result is False and kind != "readiness":
            log.info(
                "Container %s of %s/%s failed its %s probe; killing it",
                run.name,
                self.namespace,
                self.pod_name,
                kind,
            )
            self._event("Killing", f"Container {run.name} failed {kind} probe, will be restarted")
            grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            stop_runs([run], self.address, grace)
            return False
        return True

    def _exited(self, run: ContainerRun, pod: Obj, code: int, now: float) -> None:
        log.info(
            "Container %s of %s/%s exited with %d", run.name, self.namespace, self.pod_name, code
        )
        backoff = run.exited(code, pod["spec"].get("restartPolicy", "Always"), now)
        if backoff is not None:
            self._event("BackOff", backoff, "Warning")

    # -- stopping
    def _terminate(self, pod: Obj) -> None:
        meta = pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        log.info("Stopping pod %s/%s (grace %s s)", self.namespace, self.pod_name, grace)
        everything = [*self.inits, *self.runs]
        for run in everything:
            if run.running:
                self._event("Killing", f"Stopping container {run.name}")
        stop_runs(everything, self.address, float(grace))
        for run in everything:
            run.stopped()
        self._publish()
        self._release_network()
        self._confirm_deletion()

    def _confirm_deletion(self) -> None:
        """Delete the pod for good (grace 0, UID precondition), retrying while the API is busy."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        while not self._gone:
            try:
                self.api.delete(f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}", body)
            except ApiError as error:
                if error.status not in (404, 409):
                    raise
            except httpx.HTTPError as error:
                log.warning("Deletion of %s/%s failed: %r", self.namespace, self.pod_name, error)
                self._sleep(1.0)
                continue
            log.info("Deleted pod %s/%s", self.namespace, self.pod_name)
            return

    def _release_network(self) -> None:
        if self.address is not None:
            with self.ctx.network_lock:
                self.ctx.network.detach(self.address)
            self.address = None

    def _release_cgroups(self) -> None:
        """Remove the containers' cgroups (their processes have exited by now; one that has not
        is left for the kubelet's last sweep)."""
        for run in [*self.inits, *self.runs]:
            if run.cgroup is not None and not run.running and CpuQuotas.remove(run.cgroup):
                run.cgroup = None

    # -- status
    def _phase(self) -> str:
        if any(r.done and not r.succeeded for r in self.inits):
            return "Failed"
        if not self.runs or not all(r.succeeded for r in self.inits):
            return "Pending"
        if all(r.done for r in self.runs):
            return "Succeeded" if all(r.succeeded for r in self.runs) else "Failed"
        return "Running" if any(r.starts for r in self.runs) else "Pending"

    def _condition(self, kind: str, ok: bool) -> Obj:
        """A pod condition whose lastTransitionTime moves only when its status flips."""
        status = "True" if ok else "False"
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            previous = (status, now_iso())
            self._transitions[kind] = previous
        return {"type": kind, "status": status, "lastTransitionTime": previous[1]}

    def _statuses(self, runs: list[ContainerRun], specs: list[Obj]) -> list[Obj]:
        if self._waiting is not None:
            return [waiting_status(spec, *self._waiting) for spec in specs]
        return [run.status() for run in runs]

    def _status(self) -> Obj:
        spec = self.pod["spec"]
        ready = bool(self.runs) and all(r.ready for r in self.runs)
        host_ip = self.ctx.network.host_ip
        status: Obj = {
            "phase": self._phase(),
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "startTime": self._start_time,
            "conditions": [
                self._condition("PodReadyToStartContainers", self.address is not None),
                self._condition("Initialized", all(r.succeeded for r in self.inits)),
                self._condition("ContainersReady", ready),
                self._condition("Ready", ready),
            ],
            "containerStatuses": self._statuses(self.runs, spec["containers"]),
        }
        if spec.get("initContainers"):
            status["initContainerStatuses"] = self._statuses(self.inits, spec["initContainers"])
        if self._waiting is not None:
            status["reason"], status["message"] = self._waiting
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
