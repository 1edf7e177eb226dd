"""Readiness follows the engine: false while it loads and warms up, true after, 503 meanwhile."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_fixtures import MODEL, wait_for

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.server.app import create_app
from kvscale_engine.server.config import ServerConfig


def test_not_ready_until_loaded_then_serving(llama_dir: Path) -> None:
    release = threading.Event()

    def slow_engine() -> LLMEngine:
        assert release.wait(60), "the test never let the engine load"
        return LLMEngine(EngineConfig(model=str(llama_dir), max_model_len=256, num_kv_blocks=64))

    app = create_app(slow_engine, ServerConfig(served_model_name=MODEL, max_model_len=256))
    with TestClient(app) as client:
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["phase"] == "loading"
        assert client.get("/health").status_code == 200
        early = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert early.status_code == 503 and early.json()["error"]["code"] == "not_ready"
        assert "retry-after" in early.headers
        metrics = client.get("/metrics").text
        assert 'kvscale_engine_ready{engine="0",model_name="tiny-llama"} 0.0' in metrics

        release.set()
        wait_for(lambda: client.get("/ready").status_code == 200, 60, "readiness")
        done = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}
        )
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3
        metrics = client.get("/metrics").text
        assert 'kvscale_engine_ready{engine="0",model_name="tiny-llama"} 1.0' in metrics
        assert 'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 3.0' in metrics


def test_a_failed_load_reports_unhealthy(tmp_path: Path) -> None:
    def broken() -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(tmp_path / "missing")))

    app = create_app(broken, ServerConfig(served_model_name=MODEL, max_model_len=256))
    with TestClient(app) as client:
        wait_for(lambda: client.get("/health").status_code == 500, 60, "health to fail")
        assert client.get("/ready").status_code == 503
        refused = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_failed"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--traffic-classes", '[{"name": "a", "colour": "red"}]'], "unknown traffic class field"),
        (["--block-size", "3"], "block_size must be a power of two"),
        (["--max-concurrency", "0"], "max concurrency must be >= 1"),
    ],
)
def test_bad_flags_exit_with_a_message(llama_dir: Path, flags: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "kvscale_engine.cli", "serve", "--model", str(llama_dir), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and message in done.stderr
