"""A cluster's iptables chains: made when its policy controller starts, rewritten in one
transaction per resync, removed with its slot (``netns.clean_slot``, also after a crash).

Netfilter is machine-wide, so everything a cluster adds lives in chains named after its slot
(``network_policy.main_chain``) and one rule in ``FORWARD`` jumps there, matching only bridged
traffic between two ports of the cluster's own bridge (``-i kvsbrN -o kvsbrN -m physdev
--physdev-is-bridged``); other clusters and the host's other traffic never reach the chains.
Bridged frames pass through iptables only with ``net.bridge.bridge-nf-call-iptables=1``
(br_netfilter), which ``install`` sets and nothing resets, as other clusters may rely on it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .network_policy import main_chain, owns_chain

BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


class FirewallError(RuntimeError):
    """An iptables command failed, or bridged traffic cannot be filtered on this host."""


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise FirewallError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout if done.returncode == 0 else ""


def _jump(slot: int, bridge: str) -> list[str]:
    return [
        "FORWARD",
        *("-i", bridge, "-o", bridge, "-m", "physdev", "--physdev-is-bridged"),
        *("-m", "comment", "--comment", f"kvscale cluster slot {slot}"),
        *("-j", main_chain(slot)),
    ]


def _has_jump(slot: int, bridge: str) -> bool:
    argv = ["iptables", "-w", "-C", *_jump(slot, bridge)]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def restore(text: str) -> None:
    """Apply ``iptables-restore --noflush`` input (one transaction: all of it or nothing)."""
    _run(["iptables-restore", "-w", "--noflush"], stdin=text)


def chains(slot: int) -> list[str]:
    """The filter-table chains slot ``slot`` owns now."""
    listed = _run(["iptables", "-w", "-S"], check=False).splitlines()
    return [
        line.split()[1]
        for line in listed
        if line.startswith("-N ") and owns_chain(slot, line.split()[1])
    ]


def install(slot: int, bridge: str) -> None:
    """Let bridged traffic through iptables and jump to the slot's chain, which accepts
    everything until the first resync fills it."""
    if not BRIDGE_NF.exists():
        raise FirewallError(f"{BRIDGE_NF} is missing: load br_netfilter (modprobe br_netfilter)")
    if BRIDGE_NF.read_text().strip() != "1":
        BRIDGE_NF.write_text("1\n")
    top = main_chain(slot)
    restore(f"*filter\n:{top} - [0:0]\n-A {top} -j ACCEPT\nCOMMIT\n")
    if not _has_jump(slot, bridge):
        jump = _jump(slot, bridge)
        _run(["iptables", "-w", "-I", jump[0], "1", *jump[1:]])


def remove(slot: int, bridge: str) -> None:
    """Remove the jump and every chain of slot ``slot`` (nothing to do without iptables)."""
    if shutil.which("iptables") is None:
        return
    while _has_jump(slot, bridge):
        _run(["iptables", "-w", "-D", *_jump(slot, bridge)])
    owned = chains(slot)
    if owned:
        lines = [*(f":{c} - [0:0]" for c in owned), *(f"-X {c}" for c in owned)]
        restore("\n".join(["*filter", *lines, "COMMIT", ""]))
