"""An endpoint that pins no image follows the operator's default images; a pinned one stays.
Every endpoint's routers follow the operator's default router image."""

from __future__ import annotations

from typing import Any

import pytest

from kvscale import __version__
from kvscale.api.images import DefaultImages
from kvscale.children import engine, router
from kvscale.cli import default_images, parser
from kvscale.reconcile import reconcile
from kvscale_cluster.specs import HOST_PATH_MODEL, llm_spec

JSON = dict[str, Any]
OWNER = engine.Owner("chat", "team-a", "uid-1")
NEW = DefaultImages(
    "registry.example.com/kvscale/engine:0.2.0",
    "registry.example.com/vllm:v1",
    "registry.example.com/kvscale/router:0.2.0",
)


def image(deployment: JSON) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def test_an_unpinned_endpoint_runs_the_operators_defaults() -> None:
    spec = llm_spec(model=HOST_PATH_MODEL)
    assert image(engine.engine_deployment(OWNER, spec, 1, NEW)) == NEW.engine
    assert image(router.router_deployment(OWNER, spec, NEW)) == NEW.router
    vllm = llm_spec(model=HOST_PATH_MODEL, engine={"kind": "vllm"})
    assert image(engine.engine_deployment(OWNER, vllm, 1, NEW)) == NEW.vllm
    assert image(router.router_deployment(OWNER, vllm, NEW)) == NEW.router


def test_a_new_default_changes_only_the_images_of_an_unpinned_endpoint() -> None:
    """Only the template's image differs, so the Deployment's rolling update is all that runs."""
    spec = llm_spec(model=HOST_PATH_MODEL)
    old = engine.engine_deployment(OWNER, spec, 2, DefaultImages())
    new = engine.engine_deployment(OWNER, spec, 2, NEW)
    new_pod = new["spec"]["template"]["spec"]
    new_pod["containers"][0]["image"] = image(old)
    assert new == old
    assert old["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_a_new_default_router_image_rolls_the_routers_of_every_endpoint() -> None:
    """Pinned or not, kvscale or vLLM: a new default router image changes the routers' template
    image and nothing else, and leaves the engines alone."""
    router_only = DefaultImages(router=NEW.router)
    for pinned in ({}, {"image": "registry.example.com/team/engine:0.1.5"}, {"kind": "vllm"}):
        spec = llm_spec(model=HOST_PATH_MODEL, engine=pinned)
        old = router.router_deployment(OWNER, spec, DefaultImages())
        new = router.router_deployment(OWNER, spec, router_only)
        assert (image(old), image(new)) == (DefaultImages().router, NEW.router)
        new["spec"]["template"]["spec"]["containers"][0]["image"] = image(old)
        assert new == old
        engines = [
            engine.engine_deployment(OWNER, spec, 1, d) for d in (DefaultImages(), router_only)
        ]
        assert engines[0] == engines[1]


def test_a_pinned_image_stays_whatever_the_default() -> None:
    pinned = "registry.example.com/team/engine:0.1.5"
    spec = llm_spec(model=HOST_PATH_MODEL, engine={"image": pinned})
    for defaults in (DefaultImages(), NEW):
        assert image(engine.engine_deployment(OWNER, spec, 1, defaults)) == pinned
        # the pinned engine image does not decide the router's
        assert image(router.router_deployment(OWNER, spec, defaults)) == defaults.router
    vllm = llm_spec(model=HOST_PATH_MODEL, engine={"kind": "vllm", "image": "vllm/vllm-openai:v1"})
    assert image(engine.engine_deployment(OWNER, vllm, 1, NEW)) == "vllm/vllm-openai:v1"


def test_defaults_come_from_the_environment_and_refuse_a_bad_reference() -> None:
    env = {"KVSCALE_DEFAULT_ENGINE_IMAGE": NEW.engine, "KVSCALE_DEFAULT_VLLM_IMAGE": ""}
    assert DefaultImages.from_env(env) == DefaultImages(NEW.engine)
    env["KVSCALE_DEFAULT_ROUTER_IMAGE"] = NEW.router
    assert DefaultImages.from_env(env) == DefaultImages(NEW.engine, router=NEW.router)
    assert DefaultImages.from_env({}) == DefaultImages()
    assert DefaultImages().router == f"kvscale/router:{__version__}"
    with pytest.raises(ValueError, match="Default image 'http://x/engine'"):
        DefaultImages("http://x/engine")
    with pytest.raises(ValueError, match="Default image 'kvscale/router:'"):
        DefaultImages(router="kvscale/router:")


def test_the_operator_takes_its_defaults_as_flags() -> None:
    args = parser().parse_args(
        ["operator", "--default-engine-image", NEW.engine, "--default-vllm-image", NEW.vllm,
         "--default-router-image", NEW.router]
    )  # fmt: skip
    assert default_images(args, {}) == NEW
    env = {"KVSCALE_DEFAULT_ROUTER_IMAGE": "kvscale/router:9", "KVSCALE_DEFAULT_VLLM_IMAGE": "v:1"}
    assert default_images(args, env) == NEW  # the flags win
    only_env = parser().parse_args(["operator"])
    assert default_images(only_env, env) == DefaultImages(router="kvscale/router:9", vllm="v:1")


class AppliedKube:
    """Applies by echoing the object; reads nothing."""

    def get(self, *_: Any) -> None:
        return None

    def apply(self, obj: JSON, *_: Any) -> JSON:
        return obj

    def list_pods(self, *_: Any) -> list[JSON]:
        return []


def test_status_says_which_images_the_endpoint_runs() -> None:
    body: JSON = {
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "u", "generation": 1},
        "spec": {"model": {"name": "m", "source": {"dummy": {}}}},
    }
    outcome = reconcile(AppliedKube(), body, images=NEW)  # type: ignore[arg-type]
    assert outcome.status["images"] == {"engine": NEW.engine, "router": NEW.router, "pinned": False}
    body["spec"]["engine"] = {"image": "kvscale/engine:0.0.9"}
    pinned = reconcile(AppliedKube(), body, images=NEW)  # type: ignore[arg-type]
    assert pinned.status["images"] == {
        "engine": "kvscale/engine:0.0.9",
        "router": NEW.router,
        "pinned": True,
    }
