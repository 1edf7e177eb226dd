"""`kvscale`: the operator commands import none of the tools; a tool without its extra says so."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from kvscale import __version__, cli

HEAVY = ("numpy", "httpx", "tqdm", "matplotlib", "kvscale.tools.loadtest")


def test_building_the_parser_imports_no_tool() -> None:
    probe = (
        "import sys, kvscale.cli as c; c.parser(); "
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tools_are_listed_and_run_through_their_own_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "loadtest" in cli.parser().format_help()
    with pytest.raises(SystemExit) as done:
        cli.main(["loadtest", "--help"])
    assert done.value.code == 0
    assert "--traces-dir" in capsys.readouterr().out


def test_a_tool_without_its_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "kvscale.tools.loadtest", raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if kvscale[tools] were not installed
    assert cli.main(["loadtest", "--num-prompts", "3"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'kvscale[tools]'" in err and "'tqdm'" in err


def test_unknown_arguments_of_operator_commands_are_refused() -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["crd", "--bogus"])
    assert done.value.code == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvscale {__version__}"


def test_operator_logs_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvscale operator --log-format=json`: the operator's own lines through Kopf's JSON."""
    args = cli.parser().parse_args(["operator", "--log-format=json"])
    cli.configure_logging(args)
    try:
        logging.getLogger("kvscale.worker").warning("Drained replica %s", "chat-engine-0")
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        cli.configure_logging(cli.parser().parse_args(["operator"]))
    entry = json.loads(line)
    assert entry["message"] == "Drained replica chat-engine-0"
    assert entry["severity"] == "warn" and "timestamp" in entry
