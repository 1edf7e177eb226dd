"""Faults on the local cluster, with kvscale installed from `manifests/` as a platform team would:
the operator runs as a pod under its own ServiceAccount, clients reach each endpoint through its
Service with the official `openai` client, and every wait is on a condition.

- the operator's pod killed while a scale-up is under way: a new one converges to the same
  count, with the same children (no duplicate, none orphaned) and the decision history intact;
- one engine replica's process killed under load: it is restarted, the routers leave it out
  while it is not Ready, the operator's published weights leave it out (absent while not Ready
  or 0 while it warms up) until it is weighted again, the requests it was streaming fail at once
  and no other request does;
- uninstalling with endpoints still present (the operator first, then `kubectl delete -k
  manifests/`) does not wedge and leaves the CRD and the endpoints; deleting the CRD on purpose
  (`kubectl delete -k manifests/crds/`) then does not wedge either: endpoints carry no finalizer,
  and their children are garbage-collected through owner references.
"""

from __future__ import annotations

import time
from typing import Any

from scenario_helpers import (
    OPERATOR_NAMESPACE,
    OPERATOR_SELECTOR,
    TimedLoad,
    children,
    engine_running,
    in_flight,
    is_ready,
    kill_container,
    operator_pod,
    owners,
    pods,
    restarts,
    router_counters,
    upstream_failed,
    weights,
)
from test_autoscale import API, INTERVAL, MODEL, apply, endpoint, events, serving, status

from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.install import CRD_NAME, CRDS, uninstall_kvscale

ENGINES = "kvscale.io/endpoint=chat,kvscale.io/role=engine"
WEIGHT = "kvscale_router_replica_weight"  # what each router routes a replica with
FAIL_FAST_S = 30.0  # a request on a dead replica ends long before the client's 120 s timeout


def engine_deployment(api: Kube, namespace: str) -> dict[str, Any]:
    return api.get("apps/v1", "Deployment", namespace, "chat-engine") or {}


def test_operator_restart_mid_scale_converges_without_duplicates(
    cluster: Cluster, installed: None, api: Kube, namespace: str
) -> None:
    # as in the burst scenario: one replica carries 150 tokens/s, 6 requests/s need all three
    apply(cluster, namespace, endpoint(namespace, scaling={"replicaCapacityTokensPerSecond": 150}))
    url = serving(api, namespace, ready=1)
    uid = (api.get(API, "LLMEndpoint", namespace, "chat") or {})["metadata"]["uid"]
    with TimedLoad(url, MODEL) as load:
        load.set_rate(6)

        def scaling_up() -> dict[str, Any] | None:
            st = status(api, namespace)
            dep = engine_deployment(api, namespace)
            rising = dep["spec"]["replicas"] == 3 and dep["status"].get("readyReplicas", 0) < 3
            return st if st.get("desiredReplicas") == 3 and rising else None

        before = wait_for(scaling_up, timeout=8 * INTERVAL, what="a scale-up to 3 under way")
        inventory = children(api, namespace, "chat")
        old = operator_pod(api)
        assert old is not None
        kubectl(cluster, "-n", OPERATOR_NAMESPACE, "delete", "pod", old["metadata"]["name"],
                "--grace-period=0", "--force")  # fmt: skip
        killed = before["capacity"]["updatedAt"]
        counts: set[int] = set()

        def new_operator() -> dict[str, Any] | None:
            counts.add(engine_deployment(api, namespace)["spec"]["replicas"])
            pod = operator_pod(api)
            return pod if pod and pod["metadata"]["uid"] != old["metadata"]["uid"] else None

        wait_for(new_operator, timeout=180, what="a new operator pod Ready")

        def converged() -> dict[str, Any] | None:
            st = status(api, namespace)
            dep = engine_deployment(api, namespace)
            counts.add(dep["spec"]["replicas"])
            decided_again = st.get("capacity", {}).get("updatedAt") != killed
            ready = dep["status"].get("readyReplicas") == 3 and st.get("readyReplicas") == 3
            return st if decided_again and ready and st.get("desiredReplicas") == 3 else None

        after = wait_for(converged, timeout=240, what="the new operator to converge to 3")
        assert counts == {3}, f"the engine's replicas moved through {counts} across the restart"
    # serving never depends on the operator: nothing failed but the router's admission refusals
    # (429, queue deadline) while one replica took a burst sized for three
    broken = [r for r in load.failures() if not (r.error or "").startswith("RateLimitError")]
    assert not broken, broken[:5]

    # the same children: none recreated, none added, none missing
    now = children(api, namespace, "chat")
    assert sorted(now) == sorted(inventory)
    for key, obj in now.items():
        assert obj["metadata"]["uid"] == inventory[key]["metadata"]["uid"], f"{key} recreated"
    deployments = {o["metadata"]["uid"] for (k, _), o in now.items() if k == "Deployment"}
    for (kind, name), obj in now.items():
        parent = deployments if kind == "ReplicaSet" else {uid}
        assert owners(obj) & parent, f"{kind} {name} is orphaned: {owners(obj)}"
    live = [p for p in pods(api, namespace, ENGINES) if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 3, [p["metadata"]["name"] for p in live]
    replicasets = {o["metadata"]["uid"] for (k, _), o in now.items() if k == "ReplicaSet"}
    assert all(owners(p) <= replicasets for p in live)
    # the history written before the restart is still there, and nothing was undone
    assert after["decisions"][: len(before["decisions"])] == before["decisions"]
    assert after["decisions"][-1]["toReplicas"] == 3
    assert "ReplicasRestored" not in events(api, namespace)


def test_engine_crash_is_restarted_and_routed_around(
    cluster: Cluster, installed: None, api: Kube, namespace: str
) -> None:
    body = endpoint(namespace, scaling={"minReplicas": 2, "maxReplicas": 2})
    apply(cluster, namespace, body)
    url = serving(api, namespace, ready=2)

    def both_weighted() -> dict[str, float] | None:
        published = weights(api, namespace, "chat") or {}
        return published if len(published) == 2 and min(published.values()) > 0 else None

    victim = sorted(wait_for(both_weighted, timeout=120, what="both replicas weighted"))[0]
    # long answers at a rate one replica alone can carry: the killed one is caught mid-stream
    with TimedLoad(url, MODEL, max_tokens=128) as load:
        load.set_rate(0.5)

        def streaming() -> tuple[dict[str, Any], dict[tuple[str, str], float]] | None:
            # the router has a request on it and the engine is generating (its gauge alone
            # may be stale: an idle engine does not update it)
            pod = api.get("v1", "Pod", namespace, victim) or {}
            counters = router_counters(api, namespace, "chat")
            busy = in_flight(counters, victim) >= 1 and engine_running(pod) >= 1
            return (pod, counters) if busy else None

        pod, counters = wait_for(streaming, timeout=60, what=f"{victim} streaming")
        assert restarts(pod) == 0
        failed_before = upstream_failed(counters, victim)
        crashed = time.monotonic()
        kill_container(pod, "engine")
        on_victim = max(in_flight(counters, victim),
                        in_flight(router_counters(api, namespace, "chat"), victim))  # fmt: skip

        def routed_around() -> bool:
            now = api.get("v1", "Pod", namespace, victim) or {}
            routers = router_counters(api, namespace, "chat")
            return not is_ready(now) and routers.get((WEIGHT, f"replica={victim}"), 0.0) == 0

        # the routers stop routing to it at once (their pod watch sees it not Ready) ...
        wait_for(routed_around, timeout=60, what=f"{victim} not Ready and left out by the routers")

        def published() -> float:
            return float((weights(api, namespace, "chat") or {}).get(victim, 0.0))

        # ... and the operator's weights leave it out (absent while not Ready, 0 while it warms
        # up): they lag the routers' own view by a pass, so a quick restart is seen as a warm-up
        wait_for(lambda: published() == 0, timeout=60, what=f"published weights leave {victim} out")

        def back() -> bool:
            now = api.get("v1", "Pod", namespace, victim) or {}
            return restarts(now) >= 1 and is_ready(now) and published() > 0

        wait_for(back, timeout=300, what=f"{victim} restarted, Ready and weighted again")
        recovered = time.monotonic()
        wait_for(lambda: len(load.since(recovered)) >= 10, timeout=120, what="10 requests after")
        counters = router_counters(api, namespace, "chat")
    failures = [r for r in load.results if r.error is not None]
    assert all(r.started < crashed for r in failures), "a request sent after the crash failed"
    # every failure is one the router relayed from the killed replica, after its first byte
    assert len(failures) == upstream_failed(counters, victim) - failed_before, failures[:5]
    # at most those it was streaming (one caught before its first byte is retried elsewhere)
    assert len(failures) <= on_victim, f"{len(failures)} failed, {on_victim} on {victim}"
    for _, ended, error in load.finished_between(crashed, crashed):
        if error is not None:
            assert ended - crashed <= FAIL_FAST_S, f"hung {ended - crashed:.0f} s: {error}"
    now = {p["metadata"]["name"]: restarts(p) for p in pods(api, namespace, ENGINES)}
    assert now[victim] == 1 and sum(now.values()) == 1, now


def test_uninstall_with_endpoints_present_does_not_wedge(
    cluster: Cluster, installed: None, api: Kube, namespace: str
) -> None:
    for name in ("kept", "removed"):
        apply(cluster, namespace, endpoint(namespace, name=name))
    for name in ("kept", "removed"):
        serving(api, namespace, ready=1, name=name)
        found = api.get(API, "LLMEndpoint", namespace, name) or {}
        assert not found["metadata"].get("finalizers"), found["metadata"]
    owned = {name: children(api, namespace, name) for name in ("kept", "removed")}
    assert all(owned.values())
    # the operator goes first: nothing is left to remove a finalizer, were there one
    kubectl(cluster, "-n", OPERATOR_NAMESPACE, "delete", "deployment", "kvscale-operator",
            "--timeout=120s")  # fmt: skip
    wait_for(
        lambda: not pods(api, OPERATOR_NAMESPACE, OPERATOR_SELECTOR), 120, "the operator's pod gone"
    )
    kubectl(cluster, "-n", namespace, "delete", "llme", "removed", "--timeout=60s")
    uninstall_kvscale(lambda *args: kubectl(cluster, *args))  # the CRD and `kept` stay
    kubectl(cluster, "get", CRD_NAME)
    assert api.get(API, "LLMEndpoint", namespace, "kept") is not None
    assert children(api, namespace, "kept")
    # removing the CRD on purpose takes `kept` with it
    kubectl(cluster, "delete", "-k", str(CRDS), "--timeout=180s")
    assert api.get(API, "LLMEndpoint", namespace, "kept") is None

    def collected() -> bool:
        return not any(children(api, namespace, name) for name in owned)

    wait_for(collected, timeout=120, what="the endpoints' children garbage-collected")
    wait_for(lambda: not pods(api, namespace, "kvscale.io/endpoint"), 120, "their pods gone")
