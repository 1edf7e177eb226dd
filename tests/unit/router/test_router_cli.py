"""`kvscale-router --version` and `--log-format=json`: every log line parses as JSON."""

from __future__ import annotations

import json
import logging

import pytest

from kvscale_router import cli, logs


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvscale-router {logs.version()}"
    assert logs.version()[0].isdigit()


def test_json_log_lines(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["--replicas", "a=http://x:1", "--log-format", "json"])
    logs.configure(args.log_level, args.log_format)
    try:
        logging.getLogger("kvscale_router.test").info("Drained replica %s", "a")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("uvicorn.error").exception("Failed request")
        lines = capsys.readouterr().err.strip().splitlines()
    finally:
        logs.configure("warning", "text")
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "Drained replica a" and first["level"] == "INFO"
    assert first["logger"] == "kvscale_router.test" and first["timestamp"].endswith("+00:00")
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exception"]


def test_log_format_is_checked() -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--replicas", "a=http://x:1", "--log-format", "xml"])
