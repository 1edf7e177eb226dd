"""What `make image` (engine-image/build-image.sh, this tier's prerequisite) leaves in Docker's
engine: its images, and of earlier builds only the stage results the next build reuses, so that
the disk a CI machine shares with every run does not fill a commit at a time."""

from __future__ import annotations

import subprocess

import pytest

VARIANTS = ("cpu", "cuda")
STAGES = (*(f"engine-app-{v}" for v in VARIANTS), "router-builder", "operator-builder")


def untagged(label: str) -> list[str]:
    """Untagged images nothing is built on, with ``label``, newest first."""
    argv = ["docker", "images", "-q", "--filter", "dangling=true", "--filter", f"label={label}"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


def test_no_earlier_build_image_is_left_untagged() -> None:
    assert untagged("io.kvscale.image") == []


@pytest.mark.parametrize("stage", STAGES)
def test_one_result_of_each_builder_stage_is_kept_for_the_cache(stage: str) -> None:
    assert len(untagged(f"io.kvscale.stage={stage}")) <= 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_dependency_stage_is_left_without_its_app_stage(variant: str) -> None:
    # the kept engine-deps result has the kept engine-app built on it, so it is not dangling; an
    # earlier dependency set's would be
    assert untagged(f"io.kvscale.stage=engine-deps-{variant}") == []
