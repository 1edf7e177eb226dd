#!/usr/bin/env bash
# Builds a venv with GuideLLM (a load generator nobody here wrote; version pinned in VERSION) into
# ${KVSCALE_CACHE:-~/.cache/kvscale}/guidellm/<version>/ once; later calls reuse it. Prints the
# venv folder on stdout. `python -m bench engine_vs_vllm --peer` drives both servers with it.
# A stamp written last marks a finished install; an interrupted one resumes.
set -euo pipefail
cd "$(dirname "$0")"
version=$(cat VERSION)
PY=${PY:-python3}
out="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/guidellm/${version}"
stamp="$out/.installed-stamp"
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [ ! -f "$stamp" ]; then
  start=$(date +%s)
  echo "Installing guidellm ${version} into $out" >&2
  "$PY" -m venv "$out"
  "$out/bin/python" -m pip install --quiet --upgrade pip >&2
  "$out/bin/python" -m pip install --quiet "guidellm==${version}" >&2
  "$out/bin/guidellm" --help >/dev/null
  echo "guidellm ${version}" >"$stamp"
  echo "Installed GuideLLM in $(( $(date +%s) - start )) s ($(du -sh "$out" | cut -f1))" >&2
fi
echo "$out"
