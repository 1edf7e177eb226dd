#!/usr/bin/env bash
# GPU check for the engine: the correctness tier on CUDA, then throughput with a dummy
# Llama-3-8B-shaped model in bf16 (kvscale continuous vs HF static). Writes bench/results/gpu.json.
# Budget: under 10 minutes on one H100/H200-class GPU. Not yet run on a GPU (see engine-image/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RESULTS=bench/results
mkdir -p "$RESULTS"

"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device")'

# 1. Correctness: the engine tier with the engine on CUDA (fp32; HF reference on CPU).
start=$(date +%s)
set +e
KVSCALE_TEST_DEVICE=cuda timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
    tests/engine/test_correctness.py tests/engine/test_models.py tests/engine/test_requests.py \
    --junitxml="$RESULTS/gpu-correctness.xml" | tail -n 15
status=${PIPESTATUS[0]}
set -e
"$PY" - "$status" "$(( $(date +%s) - start ))" <<'PY'
import json, sys, xml.etree.ElementTree as ET
root = ET.parse("bench/results/gpu-correctness.xml").getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
keys = ("tests", "failures", "errors", "skipped")
report = {"correctness": {k: int(suite.get(k, 0)) for k in keys} | {
    "exit_status": int(sys.argv[1]), "seconds": int(sys.argv[2])}}
open("bench/results/gpu.json", "w").write(json.dumps(report, indent=2) + "\n")
print(report)
PY

# 2. Throughput: dummy Llama-3-8B shape, bf16, FlexAttention path.
timeout 420 "$PY" -m bench.gpu_check
