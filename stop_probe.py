import time, tempfile, httpx
from pathlib import Path
from bench.serving import engine_process
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
with tempfile.TemporaryDirectory() as tmp:
    model = write_tiny_checkpoint(Path(tmp) / "m", arch="llama", seed=0)
    with engine_process(model, "--max-model-len=512", torch_threads=1) as server:
        c = httpx.Client()
        for i in range(3):
            r = c.post(server.url + "/v1/completions", json={"model": "bench", "prompt": [1,2,3], "max_tokens": 4})
        t = time.monotonic()
    print("stop took", round(time.monotonic() - t, 1))
