"""Benchmarks: `python -m bench [name ...]` writes bench/results/<name>.json.

Benchmarks are not tests: they measure, side by side in one run, and report ratios together with
the machine they ran on. The registry of modules is in `bench/__main__.py`.
"""
