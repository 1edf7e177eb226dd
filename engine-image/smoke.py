"""Smoke-runs the built engine and router images as the operator's pods run them.

`PYTHONPATH=e2e python engine-image/smoke.py [--image kvscale/engine:<version>]
[--router-image kvscale/router:<version>]` (after `make image`, with the Docker engine running;
e2e/ holds kvscale_cluster, for free_port) checks that the router image holds no torch, runs as
uid 10001 and answers `--help`; starts one engine container on a tiny checkpoint and one router
container (the router image's own entry point) in front of it, both on the host's loopback;
sends a completion to the engine, a completion and a streamed chat through the router, reads
both `/metrics`, drains the engine through its admin port, stops both with `docker stop`, and
writes what it saw to bench/results/engine_image_smoke.json. Exits non-zero when a step fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from kvscale_cluster.ports import free_port
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "engine_image_smoke.json"


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done


def wait_ready(url: str, name: str, timeout_s: float = 180.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return round(time.monotonic() - started, 1)
        except httpx.TransportError:
            pass
        running = docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip()
        if running != "true":
            raise RuntimeError(
                f"{name} exited:\n{docker('logs', name, check=False).stderr[-3000:]}"
            )
        time.sleep(0.5)
    raise RuntimeError(f"{name} not ready after {timeout_s:.0f} s")


def stop(name: str) -> dict[str, Any]:
    started = time.monotonic()
    docker("stop", "--time", "40", name)
    seconds = round(time.monotonic() - started, 1)
    code = int(docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip())
    logs = docker("logs", name).stderr.splitlines()
    return {"exit_code": code, "seconds": seconds, "log_tail": logs[-4:]}


def described(image: str) -> dict[str, Any]:
    inspect = json.loads(docker("image", "inspect", image).stdout)[0]
    return {
        "image": image,
        "image_id": inspect["Id"],
        "image_created": inspect["Created"],
        "size_bytes": inspect["Size"],
        "user": inspect["Config"]["User"],
        "entrypoint": inspect["Config"]["Entrypoint"],
    }


def router_image_checks(image: str) -> dict[str, Any]:
    """The router image alone: its size and user, `--help`, and no torch in its venv."""
    out = described(image)
    helped = docker("run", "--rm", image, "--help", check=False)
    out["help_exit_code"] = helped.returncode
    out["help_usage"] = helped.stdout.splitlines()[:1]
    out["uid"] = docker("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip()
    probe = "import importlib.util as u; print(u.find_spec('torch') is not None)"
    found = docker("run", "--rm", "--entrypoint", "python3", image, "-c", probe).stdout.strip()
    out["has_torch"] = found == "True"
    return out


def smoke(image: str, router_image: str, work: Path) -> dict[str, Any]:
    model = write_tiny_checkpoint(work / "tiny", arch="llama", seed=0)
    for path in [work, *work.rglob("*")]:  # the image runs as uid 10001
        path.chmod(0o755 if path.is_dir() else 0o644)
    engine_port, admin_port, router_port = free_port(), free_port(), free_port()
    engine, router = f"kvscale-smoke-engine-{os.getpid()}", f"kvscale-smoke-router-{os.getpid()}"
    out = described(image) | {"router_image": router_image_checks(router_image)}
    try:
        # as the operator's pods run it: a read-only root with /tmp writable; and the CPU decode
        # kernel required, so the image's compiler must build it there (else it fails to start)
        docker("run", "-d", "--name", engine, "--network", "host", "--read-only",
               "--tmpfs", "/tmp:exec", "-v", f"{model}:/models/tiny:ro", image, "serve",
               "--model", "/models/tiny", "--served-model-name", "tiny", "--host", "127.0.0.1",
               "--port", str(engine_port), "--admin-port", str(admin_port),
               "--max-model-len", "512", "--num-kv-blocks", "128",
               "--decode-attention", "cpu")  # fmt: skip
        out["engine_run"] = {"read_only_root": True, "decode_attention": "cpu"}
        engine_url = f"http://127.0.0.1:{engine_port}"
        out["engine_ready_s"] = wait_ready(engine_url, engine)
        docker("run", "-d", "--name", router, "--network", "host", router_image,
               "--host", "127.0.0.1", "--port", str(router_port),
               "--replicas", f"e0={engine_url}", "--log-level", "warning")  # fmt: skip
        router_url = f"http://127.0.0.1:{router_port}"
        out["router_ready_s"] = wait_ready(router_url, router)
        body = {"model": "tiny", "prompt": "Hello from the image", "max_tokens": 8,
                "temperature": 0}  # fmt: skip
        direct = httpx.post(f"{engine_url}/v1/completions", json=body, timeout=60)
        routed = httpx.post(f"{router_url}/v1/completions", json=body, timeout=60)
        out["completion"] = {
            "direct_status": direct.status_code,
            "router_status": routed.status_code,
            "same_text": direct.json()["choices"][0]["text"] == routed.json()["choices"][0]["text"],
            "usage": routed.json()["usage"],
        }
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 8, "stream": True}  # fmt: skip
        with httpx.stream("POST", f"{router_url}/v1/chat/completions", json=chat,
                          timeout=60) as resp:  # fmt: skip
            events = [line for line in resp.iter_lines() if line.startswith("data: ")]
        out["chat_stream_through_router"] = {
            "status": resp.status_code,
            "events": len(events),
            "ends_with_done": bool(events) and events[-1] == "data: [DONE]",
        }
        router_metrics = httpx.get(f"{router_url}/metrics", timeout=10).text
        engine_metrics = httpx.get(f"{engine_url}/metrics", timeout=10).text
        out["router_metrics_families"] = sorted({
            line.split()[2] for line in router_metrics.splitlines()
            if line.startswith("# TYPE kvscale_router_")
        })  # fmt: skip
        out["engine_vllm_metrics_samples"] = sum(
            1 for line in engine_metrics.splitlines() if line.startswith("vllm:")
        )
        drain = httpx.post(f"http://127.0.0.1:{admin_port}/drain", timeout=10)
        ready_after = httpx.get(f"{engine_url}/ready", timeout=10).status_code
        out["drain"] = {"status": drain.status_code, "ready_status_after": ready_after}
        out["docker_stop"] = {"router": stop(router), "engine": stop(engine)}
    finally:
        docker("rm", "-f", engine, router, check=False)
    return out


def main() -> int:
    version = next(
        line.split('"')[1]
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
        if line.startswith("version = ")
    )
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", default=f"kvscale/engine:{version}")
    parser.add_argument("--router-image", default=f"kvscale/router:{version}")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = smoke(args.image, args.router_image, Path(tmp))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT, check=False).stdout.strip()  # fmt: skip
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "checkout_commit": commit,  # the smoke script's; the image is from `image_created`
        "built_with": "engine-image/build-image.sh (VARIANT=cpu)",
        **result,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    routing = result["router_image"]
    ok = (
        routing["help_exit_code"] == 0
        and routing["uid"] == "10001"
        and not routing["has_torch"]
        and result["completion"]["router_status"] == 200
        and result["completion"]["same_text"]
        and result["chat_stream_through_router"]["ends_with_done"]
        and result["drain"]["ready_status_after"] == 503
        and result["docker_stop"]["engine"]["exit_code"] == 0
        and result["docker_stop"]["router"]["exit_code"] == 0
    )
    print(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
