"""`kvscale plan`: the table, the LLMEndpoint patch, and clear refusals."""

from __future__ import annotations

import argparse

import pytest
import yaml

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.tools.plan import add_plan_parser


def plan(*argv: str) -> int:
    root = argparse.ArgumentParser()
    add_plan_parser(root.add_subparsers())
    args = root.parse_args(["plan", *argv])
    return int(args.func(args))


def test_table_names_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan("--model", "llama-3-8b", "--gpu", "a100-80gb") == 0
    out = capsys.readouterr().out
    for label in (
        "weights",
        "KV bytes per token",
        "KV blocks",
        "max concurrency at",
        "recommended maxNumSeqs",
        "recommended maxNumBatchedTokens",
    ):
        assert label in out
    assert "131,072" in out


def test_yaml_is_a_valid_llmendpoint_patch(capsys: pytest.CaptureFixture[str]) -> None:
    code = plan(
        "--model",
        "llama-3-8b",
        "--gpu",
        "h200",
        "--profile",
        "h200-kvscale-eager",
        "--rate",
        "20",
        "--input-len",
        "800",
        "--output-len",
        "150",
        "-o",
        "yaml",
    )
    assert code == 0
    patch = yaml.safe_load(capsys.readouterr().out)
    assert patch["kind"] == "LLMEndpoint"
    spec = patch["spec"]
    full = {**spec, "model": {"name": "m", "source": {"dummy": {}}, **spec["model"]}}
    parsed = LLMEndpointSpec.model_validate(full)
    assert parsed.scaling.replica_capacity_tokens_per_second is not None
    assert parsed.engine.max_num_batched_tokens >= parsed.engine.max_num_seqs
    assert spec["scaling"]["maxReplicas"] >= 2


def test_an_infeasible_ttft_slo_is_named_with_the_one_plan_would_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--model", "llama-3-8b", "--gpu", "h200", "--profile", "h200-kvscale-eager",
            "--input-len", "40000", "--output-len", "100", "--max-model-len", "65536"]  # fmt: skip
    assert plan(*argv, "--ttft-slo", "0.5") == 0
    out, err = capsys.readouterr()
    assert "WARNING: The 0.5 s TTFT SLO is infeasible for this workload" in err
    assert "no replica count meets it" in out  # the table's row says it too
    suggested = float(err.split("plan would set ")[1].split(" s")[0])
    assert plan(*argv, "--ttft-slo", str(suggested)) == 0
    out, err = capsys.readouterr()
    assert err == "" and f"The {suggested:g} s TTFT SLO is feasible" in out


def test_bad_input_is_refused_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan("--model", "llama-3-8b", "--gpu", "tpu") == 2
    assert "unknown GPU" in capsys.readouterr().err
    assert plan("--model", "llama-3-70b", "--gpu", "l4") == 2
    assert "fewer than one" in capsys.readouterr().err
    assert plan("--model", "llama-3-8b", "--gpu", "h200", "--memory-fraction", "1.5") == 2
    assert "memory-fraction" in capsys.readouterr().err
