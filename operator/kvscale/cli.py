"""`kvscale`: run the operator, print the CRD, and the tools (load test, simulator, planner).

`pip install 'kvscale[operator]'` is enough for `kvscale operator` and `kvscale crd`. The tools
need `kvscale[tools]` (numpy, plotting, ...), so they are imported only when one of them runs: the
top-level parser knows their names, and each tool's own parser is built on demand.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvscale import __version__

if TYPE_CHECKING:
    from kvscale.api.images import DefaultImages


@dataclass(frozen=True)
class Tool:
    """A subcommand in `kvscale.tools`, built by `module.adder(subparsers)` when it runs."""

    name: str
    module: str
    adder: str
    help: str


TOOLS = (
    Tool("loadtest", "kvscale.tools.loadtest", "add_loadtest_parser", "load-test an endpoint"),
    Tool("simulate", "kvscale.tools.simulate", "add_simulate_parser", "simulate autoscaling"),
    Tool("plan", "kvscale.tools.plan", "add_plan_parser", "plan capacity from a trace"),
)
MISSING_TOOLS = (
    "kvscale {name} needs the tools extra (no module {module!r}): pip install 'kvscale[tools]'"
)


LOG_FORMATS = ("full", "plain", "json")  # Kopf's: `full` adds time, logger and level


def configure_logging(args: argparse.Namespace) -> None:
    """Kopf's logging, for the operator's own loggers too: `json` writes one object a line
    (timestamp, level, message, and the endpoint in `object`)."""
    import kopf

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])


def default_images(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> DefaultImages:
    """The operator's default images: its flags, else the environment's, else this version's."""
    from kvscale.api.images import DefaultImages

    fallback = DefaultImages.from_env(env)
    return DefaultImages(
        args.default_engine_image or fallback.engine,
        args.default_vllm_image or fallback.vllm,
        args.default_router_image or fallback.router,
    )


def _operator(args: argparse.Namespace) -> int:
    import kopf

    import kvscale.handlers  # noqa: F401  (registers the handlers)

    configure_logging(args)
    images = default_images(args)
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(images=images),
    )
    return 0


def _crd(args: argparse.Namespace) -> int:
    from kvscale.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="kvscale", description=(__doc__ or "").split("\n\n")[0])
    root.add_argument("--version", action="version", version=f"kvscale {__version__}")
    sub = root.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", help="run the operator (Kopf) against the current cluster")
    op.add_argument("--namespace", action="append", help="watch only this namespace (repeat)")
    op.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    op.add_argument(
        "--default-engine-image",
        help="image of kind-kvscale engines that pin none "
        "(default: $KVSCALE_DEFAULT_ENGINE_IMAGE, else this version's kvscale/engine)",
    )
    op.add_argument(
        "--default-vllm-image",
        help="image of kind-vllm engines that pin none (default: $KVSCALE_DEFAULT_VLLM_IMAGE, "
        "else the vLLM release this version was tested with)",
    )
    op.add_argument(
        "--default-router-image",
        help="image of every endpoint's routers, whatever its engine's image "
        "(default: $KVSCALE_DEFAULT_ROUTER_IMAGE, else this version's kvscale/router)",
    )
    op.add_argument("--verbose", action="store_true")
    op.add_argument(
        "--log-format", choices=LOG_FORMATS, default="full", help="json: one object a line"
    )
    op.set_defaults(func=_operator)

    crd = sub.add_parser("crd", help="print the LLMEndpoint CustomResourceDefinition")
    crd.set_defaults(func=_crd)

    for tool in TOOLS:
        if importlib.util.find_spec(tool.module) is not None:  # finds, does not import
            sub.add_parser(tool.name, help=tool.help, add_help=False).set_defaults(tool=tool)
    return root


def _run_tool(tool: Tool, argv: list[str]) -> int:
    try:
        module = importlib.import_module(tool.module)
    except ModuleNotFoundError as err:
        sys.stderr.write(MISSING_TOOLS.format(name=tool.name, module=err.name) + "\n")
        return 2
    root = argparse.ArgumentParser(prog="kvscale")
    getattr(module, tool.adder)(root.add_subparsers(dest="command", required=True))
    args = root.parse_args([tool.name, *argv])
    return int(args.func(args))


def main(argv: Sequence[str] | None = None) -> int:
    root = parser()
    args, rest = root.parse_known_args(argv)
    tool: Tool | None = getattr(args, "tool", None)
    if tool is not None:
        return _run_tool(tool, rest)
    if rest:
        root.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
