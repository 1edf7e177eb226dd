"""`pip install 'kvscale[operator]'` in a clean venv runs the operator, without torch or the tools;
`pip install 'kvscale[router]'` runs the router, without torch; the wheel holds the operator, the
engine and the router, and not the local cluster harness or the demo (e2e/).

A real install from the source tree (dependencies from the package index; pip's cache is fine):
what the operator image installs, and what a user who only wants the operator gets.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from endpoint_helpers import ROOT

SOURCES = ("pyproject.toml", "README.md", "operator", "engine-image", "e2e")
NOT_FOR_THE_OPERATOR = {"torch", "numpy", "matplotlib", "tqdm", "transformers", "pandas"}


def run(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done


def _source_copy(work: Path) -> Path:
    """A copy of the source tree in `work`, so that a build writes nothing into the checkout."""
    src = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".mypy_cache")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(path, src / name)
    return src


def _venv_with(extra: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with `kvscale[<extra>]` installed from a copy of the source tree."""
    work = tmp_path_factory.mktemp(f"packaging-{extra}")
    src = _source_copy(work)
    venv = work / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(
        venv / "bin" / "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        f"{src}[{extra}]",
    )
    return venv


def test_the_wheel_holds_operator_engine_and_router_not_the_harness(tmp_path: Path) -> None:
    src = _source_copy(tmp_path)
    assert (src / "e2e" / "kvscale_cluster").is_dir() and (src / "e2e" / "kvscale_demo").is_dir()
    dist = tmp_path / "dist"
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", dist, src)
    (wheel,) = dist.glob("kvscale-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"kvscale", "kvscale_engine", "kvscale_router"}, top
    assert any(n.startswith("kvscale/profiles/") and n.endswith(".json") for n in names)


@pytest.fixture(scope="module")
def operator_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv_with("operator", tmp_path_factory)


@pytest.mark.slow
def test_the_router_extra_runs_the_router_without_torch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    venv = _venv_with("router", tmp_path_factory)
    listed = run(venv / "bin" / "pip", "list", "--format=json").stdout
    installed = {p["name"].lower() for p in json.loads(listed)}
    assert {"kubernetes_asyncio", "aiohttp", "starlette"} <= installed | {
        n.replace("-", "_") for n in installed
    }
    assert not installed & NOT_FOR_THE_OPERATOR, installed & NOT_FOR_THE_OPERATOR
    assert "--replicas" in run(venv / "bin" / "kvscale-router", "--help").stdout
    # every module, the Kubernetes watch included (what the router pods run)
    modules = sorted(p.stem for p in (ROOT / "engine-image" / "kvscale_router").glob("*.py"))
    run(venv / "bin" / "python", "-c", "; ".join(f"import kvscale_router.{m}" for m in modules))


@pytest.mark.slow
def test_the_operator_extra_installs_no_torch_and_no_tools(operator_venv: Path) -> None:
    listed = run(operator_venv / "bin" / "pip", "list", "--format=json").stdout
    installed = {p["name"].lower() for p in json.loads(listed)}
    assert {"kvscale", "kopf", "kubernetes", "prometheus-api-client"} <= installed
    assert not installed & NOT_FOR_THE_OPERATOR, installed & NOT_FOR_THE_OPERATOR


@pytest.mark.slow
def test_kvscale_operator_and_crd_run(operator_venv: Path) -> None:
    kvscale = operator_venv / "bin" / "kvscale"
    assert "--namespace" in run(kvscale, "operator", "--help").stdout
    committed = (ROOT / "crds" / "llmendpoints.kvscale.io.yaml").read_text()
    assert run(kvscale, "crd").stdout == committed
    run(operator_venv / "bin" / "python", "-c", "import kvscale.handlers")  # what `operator` runs


@pytest.mark.slow
def test_a_tool_names_its_extra(operator_venv: Path) -> None:
    done = run(operator_venv / "bin" / "kvscale", "loadtest", "--num-prompts", "1", check=False)
    assert done.returncode == 2
    assert "pip install 'kvscale[tools]'" in done.stderr, done.stderr
