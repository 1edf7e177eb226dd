"""The engine image installs what its code imports: `engine-image/requirements.py` (which the
Dockerfile runs) lists a distribution for every third-party module that the engine and the router
import, directly (no reliance on another package's dependencies)."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "engine-image" / "requirements.py"
PYPROJECT = ROOT / "pyproject.toml"
OWN = {"kvscale_engine", "kvscale_router"}
# the Dockerfile installs torch first, by variant; triton comes with its CUDA wheels and is
# imported only for decodes on CUDA (kvscale_engine.layers.paged_decode)
INSTALLED_BEFORE = {"torch", "triton"}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_requirements", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imports(package: Path) -> set[str]:
    """Top-level names of the modules a package's files import (absolute imports only)."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - OWN - {"__future__"}


def test_the_script_prints_what_its_function_returns() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(PYPROJECT)], capture_output=True, text=True, check=True
    )
    listed = done.stdout.split()
    assert listed == _script().requirements(str(PYPROJECT))
    assert not [r for r in listed if r.startswith(("torch", "kvscale"))], listed


def test_every_third_party_import_of_the_image_is_listed() -> None:
    wanted = _script().requirements(str(PYPROJECT))
    listed = {canonicalize_name(Requirement(r).name) for r in wanted}
    listed |= INSTALLED_BEFORE
    providers = importlib.metadata.packages_distributions()
    modules = _imports(ROOT / "engine-image" / "kvscale_engine") | _imports(
        ROOT / "engine-image" / "kvscale_router"
    )
    assert {"torch", "starlette", "kubernetes_asyncio", "aiohttp"} <= modules  # it reads the code
    missing = {
        module: providers.get(module)
        for module in modules
        if not {canonicalize_name(d) for d in providers.get(module, [])} & listed
    }
    assert not missing, f"imported by the image's code but not installed by it: {missing}"
