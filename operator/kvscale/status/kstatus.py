"""`Ready`, `Reconciling` and `Stalled` as kstatus (Flux, Argo CD) reads them, from the others."""

from __future__ import annotations

from kvscale.status.conditions import Cond

# Degraded reasons that will not go away by waiting: kstatus calls the object Stalled
STUCK = {
    "InvalidSpec",
    "ProgressDeadlineExceeded",
    "ImagePullFailed",
    "EngineCrashLooping",
    "EngineConfigError",
    "ModelSourceNotFound",
    "ReplicaFailure",
}


def kstatus(conds: list[Cond]) -> list[Cond]:
    """`Ready`, `Reconciling` and `Stalled` as kstatus (Flux, Argo CD) reads them.

    `Reconciling` and `Stalled` are abnormal-true: True only while converging or stuck.
    """
    by_type = {c.type: c for c in conds}
    degraded = by_type.get("Degraded")
    progressing = by_type.get("Progressing")
    available = by_type.get("Available")
    if degraded is not None and degraded.status == "True" and degraded.reason in STUCK:
        return [
            Cond("Stalled", "True", degraded.reason, degraded.message),
            Cond("Reconciling", "False", "Stalled", "Stuck until the problem is fixed"),
            Cond("Ready", "False", degraded.reason, degraded.message),
        ]
    stalled = Cond("Stalled", "False", "AsExpected", "Nothing blocks progress")
    if progressing is not None and progressing.status == "True":
        return [
            stalled,
            Cond("Reconciling", "True", progressing.reason, progressing.message),
            Cond("Ready", "False", progressing.reason, progressing.message),
        ]
    settled = Cond("Reconciling", "False", "Settled", "The endpoint matches its spec")
    if available is not None and (available.status == "True" or available.reason == "ScaledToZero"):
        return [stalled, settled, Cond("Ready", "True", available.reason, available.message)]
    why = available or Cond("Available", "False", "Unknown", "Availability unknown")
    return [stalled, settled, Cond("Ready", "False", why.reason, why.message)]
