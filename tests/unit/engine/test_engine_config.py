"""EngineConfig and SamplingParams refuse bad values with a message that names the field."""

from __future__ import annotations

from typing import Any

import pytest

from kvscale_engine.config import ConfigError, EngineConfig
from kvscale_engine.sampling_params import SamplingError, SamplingParams


def test_defaults_are_valid_and_derived_values_follow() -> None:
    config = EngineConfig(model="dummy:llama-3-8b", max_model_len=1000, block_size=16)
    assert config.is_dummy and config.model_source == "llama-3-8b"
    assert config.max_blocks_per_seq == 63
    assert "llama-3-8b" in config.cache_salt


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", " "),
        ("model", "dummy:"),
        ("max_model_len", 0),
        ("block_size", 12),
        ("memory_fraction", 0.0),
        ("memory_fraction", 1.5),
        ("num_kv_blocks", 0),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("scheduling", "fifo"),
        ("dtype", "int8"),
        ("device", "tpu"),
        ("attention_backend", "flash"),
        ("decode_attention", "flash"),
        ("priority_aging_steps", 0),
    ],
)
def test_bad_engine_settings_raise_config_error(field: str, value: Any) -> None:
    settings = {"model": "dummy:llama-tiny", field: value}
    with pytest.raises(ConfigError, match=field.split("_")[0]):
        EngineConfig(**settings)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(SamplingError, ValueError)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.1),
        ("top_k", -2),
        ("max_tokens", 0),
        ("stop", [""]),
        ("stop_token_ids", [-1]),
    ],
)
def test_bad_sampling_params_raise(field: str, value: Any) -> None:
    with pytest.raises(SamplingError, match=field.split("_")[0]):
        SamplingParams(**{field: value})


def test_sampling_params_normalise_stops() -> None:
    params = SamplingParams(stop="###", stop_token_ids=[3, 4], temperature=0)
    assert params.stop == ("###",) and params.stop_token_ids == (3, 4)
    assert params.greedy and params.max_stop_len == 3


def test_engine_defaults_match_what_the_operator_assumes() -> None:
    """The operator drains a victim at ADMIN_PORT and sizes the grace period from these."""
    from kvscale.children.engine_args import ADMIN_PORT, ENGINE_PORT, SHUTDOWN_GRACE_SECONDS
    from kvscale_engine.cli import build_parser

    args = build_parser().parse_args(["serve", "--model", "dummy:llama-tiny"])
    assert (args.port, args.admin_port) == (ENGINE_PORT, ADMIN_PORT)
    assert args.shutdown_grace == SHUTDOWN_GRACE_SECONDS


@pytest.mark.parametrize(
    ("argv", "eager", "decode"),
    [
        ([], False, "auto"),
        (["--enforce-eager", "--decode-attention", "reference"], True, "reference"),
    ],
)
def test_enforce_eager_and_decode_attention_flags(
    argv: list[str], eager: bool, decode: str
) -> None:
    from kvscale_engine.cli import build_parser, engine_config

    args = build_parser().parse_args(["serve", "--model", "dummy:llama-tiny", *argv])
    config = engine_config(args)
    assert (config.enforce_eager, config.decode_attention) == (eager, decode)


@pytest.mark.parametrize(
    ("argv", "small"),
    [([], True), (["--no-small-batch-weights"], False), (["--small-batch-weights"], True)],
)
def test_small_batch_weights_flag(argv: list[str], small: bool) -> None:
    from kvscale_engine.cli import build_parser, engine_config

    args = build_parser().parse_args(["serve", "--model", "dummy:llama-tiny", *argv])
    assert engine_config(args).small_batch_weights is small
