"""Prints the engine image's Python dependencies, one a line, from pyproject.toml (one list).

The package's own dependencies and those of its `engine` and `router` extras, less torch (the
Dockerfile installs it first, by variant) and the extras' references to kvscale itself. Run by the
Dockerfile's builder stage with the image's Python (3.11: `tomllib`), and by a unit test.
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: str) -> list[str]:
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["engine"], *extras["router"]]
    return list(dict.fromkeys(d for d in wanted if not d.startswith(("torch", "kvscale"))))


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
