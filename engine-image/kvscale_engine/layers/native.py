"""C sources beside this module built once per machine into shared libraries, loaded via ctypes.

A library is compiled on first use with the system C compiler into a cache keyed by the source,
the flags and the CPU (KVSCALE_KERNEL_CACHE, else ~/.cache/kvscale/kernels, else the temp folder
when home is read-only), and moved into place by rename, so concurrent processes agree; builds of
older sources are removed then. `build()` returns None when no compiler is there or the build
fails (logged), and the caller keeps its torch path. The kernels take fp32 CPU tensors, which
`require_fp32_cpu` checks for their wrappers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)
LINK = ("-shared", "-fopenmp")


def build(source: Path, flags: tuple[str, ...], what: str) -> Path | None:
    """The shared library of `source` built with `flags`, from the cache when it is there;
    None (logged, naming `what` falls back) without a compiler or when the build fails."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.warning("No C compiler (cc, gcc or $CC): %s", what)
        return None
    path = _cache_dir() / f"{source.stem}-{_key(cc, source, flags)}.so"
    if not path.exists():
        try:
            _build(cc, source, flags, path)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            log.warning("Building %s failed (%s): %s", source.name, detail, what)
            return None
    return path


def require_fp32_cpu(kernel: str, *tensors: torch.Tensor) -> None:
    """ValueError, naming `kernel`, unless every tensor is fp32 on the CPU."""
    for t in tensors:
        if t.dtype is not torch.float32 or not t.is_cpu:
            raise ValueError(f"{kernel} takes fp32 CPU tensors, not {t.dtype} on {t.device}")


def _build(cc: str, source: Path, flags: tuple[str, ...], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        obj, lib = Path(tmp) / f"{source.stem}.o", Path(tmp) / f"{source.stem}.so"
        for cmd in ([cc, *flags, "-c", str(source), "-o", str(obj)],
                    [cc, *LINK, str(obj), "-o", str(lib), "-lm"]):  # fmt: skip
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(lib, path)
    for stale in path.parent.glob(f"{source.stem}-*.so"):  # older sources' builds
        if stale != path:
            stale.unlink(missing_ok=True)


def _key(cc: str, source: Path, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256(source.read_bytes())
    h.update(" ".join((cc, *flags, *LINK, platform.machine(), _cpu())).encode())
    return h.hexdigest()[:16]


def _cpu() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "|".join(sorted({ln for ln in lines if ln.split(":")[0].strip() in wanted}))


def _cache_dir() -> Path:
    configured = os.environ.get("KVSCALE_KERNEL_CACHE")
    if configured:
        return Path(configured)
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvscale" / "kernels"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "kvscale-kernels"
