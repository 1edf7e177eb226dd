"""The CPU's paged decode (`cpu_decode.c`): built once per machine with the C compiler, via ctypes.

The reference decode gathers each sequence's context into a padded copy and runs SDPA over it;
on the CPU that copy and SDPA's padded work were about 40% of a decode step at 32 in flight.
This kernel reads K/V in place through the block tables instead (the CPU twin of the Triton
kernel in paged_decode.py, with the same arguments). Built for a CPU with AVX-512 (`lanes` 16),
the common head shapes score sixteen rows of a block into one vector per query head instead of a
horizontal sum per row and head: 64 sequences x 150-500 tokens, one layer, 1.00 -> 0.86 ms with
the cache warm (the shared-prefix case) and within the run-to-run spread (2.3-2.6 ms) with 8
layers' caches read in turn, where the wait is on DRAM. For that wait, the wide path takes a
whole sequence per task once there are two sequences per thread, reads a block's rows for every
KV head in turn, and asks for the next block a row at a time: the same case on two threads,
14.7-16.1 -> 10.9-12.6 ms; a decode step at 64 in flight 8% shorter, at 32 x 1,000-2,000 tokens
18% (cpu_decode.c says how).

The shared library is compiled on first use with `-O3 -march=native -ffast-math` into a cache
keyed by the source, the flags and the CPU (KVSCALE_KERNEL_CACHE, else ~/.cache/kvscale/kernels,
else the temp folder when home is read-only), and moved into place by rename, so concurrent
processes agree; builds of older sources are removed then.
`load()` returns None when no compiler is there, and the model runner keeps the reference
decode, saying why.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from kvscale_engine.model_config import ModelConfig

log = logging.getLogger(__name__)
MAX_GROUP, MAX_DIM, MAX_BLOCK = 16, 256, 64  # as cpu_decode.c sizes its buffers
SOURCE = Path(__file__).with_suffix(".c")
# -ffast-math lets expf vectorize (glibc's libmvec); it is given to the compile step only, since
# linking a shared library with it would set flush-to-zero for the whole process (torch too)
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11")
LINK = ("-shared", "-fopenmp")


class Kernel:
    """The loaded library's `kvscale_paged_decode`, behind paged_decode.py's signature."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.kvscale_paged_decode
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 7 + [ctypes.c_float, ctypes.c_int]
        self._fn = fn
        lib.kvscale_decode_lanes.restype = ctypes.c_int
        self.lanes: int = lib.kvscale_decode_lanes()  # 16: the AVX-512 path; 1: scalar rows

    def __call__(
        self,
        q: torch.Tensor,  # [batch, heads, dim]
        k_cache: torch.Tensor,  # [slots, kv_heads, dim]
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [batch, max_blocks] int32
        context_lens: torch.Tensor,  # [batch] int32
        *,
        scale: float,
        block_size: int,
        window: int | None = None,
    ) -> torch.Tensor:
        for t in (q, k_cache, v_cache):
            if t.dtype != torch.float32 or t.device.type != "cpu":
                msg = f"cpu paged decode takes fp32 CPU tensors, not {t.dtype} on {t.device}"
                raise ValueError(msg)
        q = q.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = context_lens.to(torch.int32).contiguous()
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("cpu paged decode reads the KV cache in place: it must be contiguous")
        batch, heads, dim = q.shape
        out = torch.empty_like(q)
        rc = self._fn(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
            tables.data_ptr(), lens.data_ptr(), batch, heads, k_cache.shape[1], dim, block_size,
            tables.shape[1], window or 0, scale, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(
                f"cpu paged decode: {heads} heads over {k_cache.shape[1]} KV heads, head_dim {dim}"
                f" or block size {block_size} is beyond its buffers (see unsupported())"
            )
        return out


def unsupported(model: ModelConfig, block_size: int) -> str | None:
    """Why the kernel cannot serve this model (its stack buffers' limits), or None."""
    group = model.num_attention_heads // model.num_key_value_heads
    if group > MAX_GROUP or model.head_dim > MAX_DIM or block_size > MAX_BLOCK:
        return (
            f"the CPU decode kernel takes up to {MAX_GROUP} query heads per KV head, head_dim "
            f"{MAX_DIM} and block size {MAX_BLOCK} (this model: {group}, {model.head_dim}, "
            f"block size {block_size})"
        )
    return None


def load() -> Kernel | None:
    """The compiled kernel, building it first if this machine has no copy; None without a
    C compiler or when the build fails (logged)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.warning("No C compiler (cc, gcc or $CC): the CPU decode gathers K/V (slower)")
        return None
    path = _cache_dir() / f"cpu_decode-{_key(cc)}.so"
    if not path.exists():
        try:
            _build(cc, path)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            log.warning("Building the CPU decode kernel failed (%s): gathering K/V instead", detail)
            return None
    return Kernel(ctypes.CDLL(str(path)))


def _build(cc: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        obj, lib = Path(tmp) / "cpu_decode.o", Path(tmp) / "cpu_decode.so"
        for cmd in ([cc, *FLAGS, "-c", str(SOURCE), "-o", str(obj)],
                    [cc, *LINK, str(obj), "-o", str(lib), "-lm"]):  # fmt: skip
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(lib, path)
    for stale in path.parent.glob("cpu_decode-*.so"):  # older sources' builds
        if stale != path:
            stale.unlink(missing_ok=True)


def _key(cc: str) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join((cc, *FLAGS, *LINK, platform.machine(), _cpu())).encode())
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
