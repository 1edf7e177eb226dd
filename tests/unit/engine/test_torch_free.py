"""Bookkeeping imports no torch, so it stays fast to test and easy to reason about."""

from __future__ import annotations

import subprocess
import sys

BOOKKEEPING = [
    "config", "sampling_params", "model_config", "engine.sequence", "engine.outputs",
    "engine.prefix_hash", "engine.block_manager", "engine.scheduler", "engine.detokenizer",
    "engine.memory_budget", "engine.tokenizer", "engine.cuda_graphs",
]  # fmt: skip


def test_bookkeeping_modules_do_not_import_torch() -> None:
    imports = "; ".join(f"import kvscale_engine.{m}" for m in BOOKKEEPING)
    code = f"import sys; {imports}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_servers_process_does_not_import_torch() -> None:
    """`kvscale-engine serve` runs the engine in a child process; the server's own process (HTTP,
    tokenising, metrics) stays without torch: 58 MB resident, where importing torch made it 558."""
    server = ["cli", "server.app", "server.state", "server.engine_process", "server.engine_thread"]
    imports = "; ".join(f"import kvscale_engine.{m}" for m in server)
    # what the server's process loads itself: the tokenizer (a dummy model's built-in one too)
    tokenizer = (
        "from kvscale_engine.config import EngineConfig; "
        "from kvscale_engine.engine.tokenizer import load_tokenizer; "
        "load_tokenizer(EngineConfig(model='dummy:llama-tiny'))"
    )
    code = f"import sys; {imports}; {tokenizer}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
