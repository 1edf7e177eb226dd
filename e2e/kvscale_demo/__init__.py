"""``make demo``: kvscale's closed loop on the local cluster (``kvscale_cluster``), watched live.

A script for people, not a library: it is not in the wheel, and runs from the source tree with
``PYTHONPATH=e2e python -m kvscale_demo``.
"""
