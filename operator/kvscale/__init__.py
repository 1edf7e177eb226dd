"""kvscale: a Kubernetes operator that autoscales LLM inference."""

__version__ = "0.1.0"  # equals pyproject.toml's version (a unit test checks)
