"""`python -m bench peer_client`: our load-test client against GuideLLM, on both servers.

`engine_vs_vllm` trusts `kvscale loadtest`'s clock. This checks that clock against a load
generator nobody here wrote: GuideLLM (vLLM project; pinned in bench/guidellm/VERSION, installed
into its own venv by bench/guidellm/install.sh). Both clients drive the kvscale engine and then
vLLM with the same shape of load, one client after the other on the same server: closed loops of
fixed 128-token prompts and 128 output tokens (`ignore_eos`, greedy). GuideLLM sends text that
the checkpoint's tokenizer (tokenizer.json, loaded by transformers' AutoTokenizer) makes 128
tokens long; ours sends 128 token ids. Agreement is judged within 10% on output tok/s, TTFT p50
and mean ITL.

The metrics are not defined alike, so only comparable ones are compared: GuideLLM's ITL is each
request's (latency - TTFT) / (tokens - 1), token-weighted, i.e. the mean gap between tokens, so
it is set beside our mean ITL (not the p50 of raw gaps); its throughput here is completed output
tokens over the benchmark's duration, like ours. Both clients share the 2 CPUs with the server,
so each client's own CPU time is recorded beside its numbers.

A closed loop's TTFT depends on how the client paces its slots: requests sent together share one
prefill step, which takes longer the more prompts it holds. So each client's requests are also
grouped by how many were sent within 20 ms of each (`sent_together`), with the TTFT p50 of those
sent with every other slot and of those sent with fewer: where the two clients pace alike, their
TTFTs should agree; where they do not, these rows say whether the pacing explains the gap.

A third view settles whose clock is off: the server's own mean TTFT over each client's run (both
servers export vllm:time_to_first_token_seconds; its sum over its count between a scrape before
and one after). Where a client's mean TTFT is the server's for that run, the client measures what
the server did, and a gap between the two clients is the load each applied, not how it timed it.
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.engine_vs_vllm import THREADS, Load, _run_load
from bench.serving import EngineProcess, engine_process, vllm_process
from kvscale.tools.promtext import Labels, parse_prometheus_text, total
from kvscale.tools.workload import PlannedRequest
from kvscale_cluster.images import vllm_python
from kvscale_engine.engine.checkpoint import VLLM_CPU_SIZES, write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS

INSTALL = Path(__file__).parent / "guidellm" / "install.sh"
FULL: dict[str, Any] = {
    "arch": "llama-bench-vllm", "sizes": {}, "in_flight": (8, 32), "requests_per_slot": 3,
    "prompt": 128, "output": 128,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "arch": "llama-tiny", "sizes": VLLM_CPU_SIZES, "in_flight": (2,), "requests_per_slot": 2,
    "prompt": 32, "output": 16,
}  # fmt: skip
AGREE = 0.10
TOGETHER_S = 0.02  # requests sent this close together meet in one prefill step


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    guidellm = Path(subprocess.run([str(INSTALL)], check=True, capture_output=True, text=True)
                    .stdout.strip().splitlines()[-1])  # fmt: skip
    venv = Path(vllm_python("vllm/vllm-openai")).parent.parent
    arch = NAMED_ARCHS[str(p["arch"])] | p["sizes"]
    shape = {k: v for k, v in arch.items() if k != "model_type"}
    args = ["--max-model-len=2048", "--dtype=float32"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_checkpoint(Path(tmp) / "model", seed=0, **shape)
        with engine_process(model, *args, "--no-admission", torch_threads=THREADS) as server:
            results["kvscale"] = _compare(server, guidellm, model, p, Path(tmp))
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": str(THREADS)}
        with vllm_process(venv, model, *args, "--enforce-eager", env=env) as server:
            results["vllm"] = _compare(server, guidellm, model, p, Path(tmp))
    checks = {
        f"{server}/{load}/{metric}": row["within_10pct"]
        for server, loads in results.items()
        for load, rows in loads.items()
        for metric, row in rows["agreement"].items()
    }
    clocks = {
        f"{server}/{load}/{client}": rows[client]["clock_vs_server"]["within_10pct"]
        for server, loads in results.items()
        for load, rows in loads.items()
        for client in ("kvscale_loadtest", "guidellm")
    }
    return {
        "agree": all(checks.values()),
        "checks": checks,
        # each client's mean TTFT within 10% of the server's own for its run: the clock is right
        "clocks_agree_with_server": all(clocks.values()),
        "clock_checks": clocks,
        "runs": results,
        "guidellm": (guidellm / ".installed-stamp").read_text().strip(),
        "workload": {k: v for k, v in p.items() if k not in ("arch", "sizes")},
        "notes": __doc__.split("\n\n", 2)[2].replace("\n", " ") if __doc__ else "",
    }


def _compare(
    server: EngineProcess, guidellm: Path, model: Path, p: dict[str, Any], tmp: Path
) -> dict[str, Any]:
    rng = random.Random(0)
    warm = [_request(i, p, rng) for i in range(4)]
    _run_load(server, Load("warmup", warm, 4))
    out: dict[str, Any] = {}
    for n in p["in_flight"]:
        count = n * int(p["requests_per_slot"])
        requests = [_request(i, p, rng) for i in range(count)]
        cpu, before = time.process_time(), _scrape(server.url)
        ours = _run_load(server, Load(f"closed_{n}", requests, n))
        records = ours.pop("records")
        ours["client_cpu_s"] = round(time.process_time() - cpu, 2)
        ours["pacing"] = pacing([(r.start_s, r.ttft_s or 0.0) for r in records], n)
        ours["ttft_mean_ms"] = round(statistics.mean(r.ttft_s or 0.0 for r in records) * 1000, 2)
        between = _scrape(server.url)  # after ours, before theirs: nothing runs in between
        ours["server_ttft_mean_ms"] = server_ttft_mean_ms(before, between)
        theirs = _guidellm(server.url, guidellm, model, n, count, p, tmp / f"gl-{n}.json")
        theirs["server_ttft_mean_ms"] = server_ttft_mean_ms(between, _scrape(server.url))
        for client in (ours, theirs):
            client["clock_vs_server"] = _clock_vs_server(client)
        pairs = {k: (ours[k], theirs[k]) for k in ("output_tok_s", "ttft_p50_ms", "itl_mean_ms")}
        out[f"closed_{n}"] = {
            "kvscale_loadtest": ours,
            "guidellm": theirs,
            "agreement": {
                k: {"ratio": round(a / b, 3), "within_10pct": abs(a / b - 1) <= AGREE}
                for k, (a, b) in pairs.items()
            },
        }
    return out


def _clock_vs_server(client: dict[str, Any]) -> dict[str, Any]:
    """The client's mean TTFT over the server's own for the same run."""
    server = client["server_ttft_mean_ms"]
    if server is None:
        return {"ratio": None, "within_10pct": False}
    ratio = client["ttft_mean_ms"] / server
    return {"ratio": round(ratio, 3), "within_10pct": abs(ratio - 1) <= AGREE}


def _request(index: int, p: dict[str, Any], rng: random.Random) -> PlannedRequest:
    prompt = [rng.randrange(5, 512) for _ in range(int(p["prompt"]))]
    return PlannedRequest(index, 0.0, prompt, len(prompt), int(p["output"]), None)


def _guidellm(
    url: str, venv: Path, model: Path, n: int, count: int, p: dict[str, Any], out: Path
) -> dict[str, Any]:
    spec = {
        "backend": {"kind": "openai_http", "target": url, "request_format": "/v1/completions",
                    "model": "bench", "extras": {"body": {"temperature": 0.0}}},
        "tokenizer": {"kind": "huggingface_auto", "model": str(model)},
        "profile": {"kind": "concurrent", "streams": n},
        "data": [{"kind": "synthetic_text", "prompt_tokens": p["prompt"],
                  "output_tokens": p["output"]}],
        "constraints": [{"kind": "max_requests", "count": count}],
        "outputs": [{"kind": "json", "path": str(out)}],
    }  # fmt: skip
    scenario = out.with_suffix(".scenario.json")
    scenario.write_text(json.dumps({"metadata": {"name": "kvscale-peer"}, "spec": spec}))
    command = [str(venv / "bin" / "guidellm"), "run", "-c", str(scenario), "--disable-console"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    bench = json.loads(out.read_text())["benchmarks"][0]
    timings = [r["info"]["timings"] for r in bench["requests"]["successful"]]
    sent = [(t["request_start"], t["first_token_iteration"] - t["request_start"]) for t in timings]
    m = bench["metrics"]
    tokens = m["output_token_count"]["successful"]["total_sum"]
    return {
        "completed": m["request_totals"]["successful"],
        "seconds": round(bench["duration"], 2),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / bench["duration"], 1),
        "ttft_p50_ms": round(m["time_to_first_token_ms"]["successful"]["median"], 2),
        "ttft_p99_ms": round(m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"], 2),
        "ttft_mean_ms": round(m["time_to_first_token_ms"]["successful"]["mean"], 2),
        "itl_mean_ms": round(m["inter_token_latency_ms"]["successful"]["mean"], 2),
        "client_cpu_s": round(cpu, 2),  # its processes' CPU time, start-up included
        "pacing": pacing(sent, n),
    }


def _scrape(url: str) -> dict[str, dict[Labels, float]]:
    return parse_prometheus_text(httpx.get(f"{url}/metrics", timeout=30).text)


def server_ttft_mean_ms(
    before: dict[str, dict[Labels, float]], after: dict[str, dict[Labels, float]]
) -> float | None:
    """The server's own mean TTFT over the requests between two scrapes (its
    vllm:time_to_first_token_seconds histogram's sum and count); None when it has no such
    histogram or served none."""
    name = "vllm:time_to_first_token_seconds"
    sums = [total(x, f"{name}_sum") for x in (before, after)]
    counts = [total(x, f"{name}_count") for x in (before, after)]
    if None in sums or None in counts:
        return None
    served = (counts[1] or 0) - (counts[0] or 0)
    return round(((sums[1] or 0) - (sums[0] or 0)) / served * 1000, 2) if served else None


def pacing(sent: list[tuple[float, float]], slots: int) -> dict[str, Any]:
    """(start, TTFT) per request -> how many each was sent with (within TOGETHER_S, itself
    counted), and the TTFT p50 of requests sent with every slot vs with fewer."""
    starts = [start for start, _ in sent]
    together = [sum(abs(other - start) <= TOGETHER_S for other in starts) for start in starts]
    full = [ttft for (_, ttft), k in zip(sent, together, strict=True) if k >= slots]
    fewer = [ttft for (_, ttft), k in zip(sent, together, strict=True) if k < slots]

    def p50_ms(values: list[float]) -> float | None:
        return round(statistics.median(values) * 1000, 2) if values else None

    return {
        "sent_together_p50": statistics.median(together),
        "requests_sent_with_every_slot": len(full),
        "ttft_p50_ms_sent_with_every_slot": p50_ms(full),
        "ttft_p50_ms_sent_with_fewer": p50_ms(fewer),
    }
