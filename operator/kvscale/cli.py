"""`kvscale`: run the operator, print the CRD, and the tools (load test, ...)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _operator(args: argparse.Namespace) -> int:
    import kopf

    import kvscale.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=args.verbose)
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
    )
    return 0


def _crd(args: argparse.Namespace) -> int:
    from kvscale.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="kvscale", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", help="run the operator (Kopf) against the current cluster")
    op.add_argument("--namespace", action="append", help="watch only this namespace (repeat)")
    op.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    op.add_argument("--verbose", action="store_true")
    op.set_defaults(func=_operator)

    crd = sub.add_parser("crd", help="print the LLMEndpoint CustomResourceDefinition")
    crd.set_defaults(func=_crd)

    from kvscale.tools.loadtest import add_loadtest_parser

    add_loadtest_parser(sub)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
