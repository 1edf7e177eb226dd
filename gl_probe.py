import json, tempfile, sys
from pathlib import Path
from bench.peer_client import _guidellm, QUICK
from bench.serving import engine_process
from kvscale_engine.engine.checkpoint import VLLM_CPU_SIZES, write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS
p = QUICK
arch = NAMED_ARCHS["llama-tiny"] | p["sizes"]
shape = {k: v for k, v in arch.items() if k != "model_type"}
venv = Path("/root/.cache/kvscale/guidellm/0.8.1")
with tempfile.TemporaryDirectory() as tmp:
    model = write_tiny_checkpoint(Path(tmp) / "model", seed=0, **shape)
    with engine_process(model, "--max-model-len=2048", "--no-admission", torch_threads=1) as server:
        out = Path("/tmp/probe/gl.json")
        print(_guidellm(server.url, venv, model, 2, 4, p, out))
