"""Every alert of the chart's PrometheusRule, run by Prometheus' own rule engine
(`promtool test rules`, Debian's prometheus package) over series it is meant to catch, and
over series it must stay quiet on. A new alert without both cases fails here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helm import Obj  # tests/chart is on sys.path

RELEASE_NAMESPACE = "glm-system"
JOB = "glm-glm-operator-metrics"  # the metrics Service of release "glm" (the scrape job)
SEL = f'job="{JOB}", namespace="{RELEASE_NAMESPACE}"'
OURS = {"job": JOB, "namespace": RELEASE_NAMESPACE}


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


# alert -> (series that must fire it, when, the alert's own labels; series it must not fire on)
CASES: dict[str, dict[str, Any]] = {
    "GLMOperatorDown": {
        "fires": [_series("up", {**OURS, "instance": "10.0.0.1:8080"}, "0x20")],
        # absent() of a comparison carries no labels of the series it looked for
        "at": "10m", "labels": {},
        "quiet": [_series("up", {**OURS, "instance": "10.0.0.1:8080"}, "1x20"),
                  # another release's operator being down is not ours
                  _series("up", {"job": "other-metrics", "namespace": "other",
                                 "instance": "10.0.0.2:8080"}, "0x20")],
    },
    "GLMOperatorNoLeader": {
        "fires": [_series("glm_operator_leader", {**OURS, "pod": "a"}, "0x10"),
                  _series("glm_operator_leader", {**OURS, "pod": "b"}, "0x10")],
        "at": "5m", "labels": {},
        "quiet": [_series("glm_operator_leader", {**OURS, "pod": "a"}, "1x10"),
                  _series("glm_operator_leader", {**OURS, "pod": "b"}, "0x10")],
    },
    "GLMOperatorReconcileErrors": {
        "fires": [_series("glm_operator_reconciles_total",
                          {**OURS, "kind": "GLMService", "result": "error"}, "0+2x40")],
        "at": "30m", "labels": {"kind": "GLMService"},
        # reconciles that succeed, and errors that stopped long ago
        "quiet": [_series("glm_operator_reconciles_total",
                          {**OURS, "kind": "GLMService", "result": "ok"}, "0+5x40"),
                  _series("glm_operator_reconciles_total",
                          {**OURS, "kind": "ModelVersion", "result": "error"}, "3x40")],
    },
    "GLMServicePlanInfeasible": {
        "fires": [_series("glm_operator_plan_failures_total", {**OURS, "reason": "Infeasible"},
                          "0 0 0 0 0 1x20")],
        "at": "10m", "labels": {"reason": "Infeasible"},
        "quiet": [_series("glm_operator_plan_failures_total", {**OURS, "reason": "Infeasible"},
                          "3x30")],
    },
    "GLMServiceRolledBack": {
        "fires": [_series("glm_operator_rollouts_total",
                          {**OURS, "strategy": "canary", "result": "RolledBack"},
                          "0 0 0 1x30")],
        "at": "10m", "labels": {},
        "quiet": [_series("glm_operator_rollouts_total",
                          {**OURS, "strategy": "canary", "result": "Succeeded"}, "0 0 0 1x30"),
                  _series("glm_operator_rollouts_total",
                          {**OURS, "strategy": "canary", "result": "RolledBack"}, "1x30")],
    },
    "GLMModelFetchFailed": {
        "fires": [_series("kube_job_failed", {"namespace": "team-a", "job_name": "glm-4-fetch",
                                              "condition": "true"}, "1x10")],
        "at": "5m", "labels": {"namespace": "team-a", "job_name": "glm-4-fetch"},
        # a Job that is not a fetch Job, and a fetch Job that did not fail
        "quiet": [_series("kube_job_failed", {"namespace": "team-a", "job_name": "backup",
                                              "condition": "true"}, "1x10"),
                  _series("kube_job_failed", {"namespace": "team-a", "job_name": "glm-4-fetch",
                                              "condition": "false"}, "1x10")],
    },
}


def _expanded(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus expands it: only `{{ $labels.x }}` is used in ours."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)


def _test_groups(rules: list[Obj]) -> list[dict[str, Any]]:
    groups = []
    for rule in rules:
        case = CASES[rule["alert"]]
        labels = {**case["labels"], **rule["labels"]}
        fired = {"exp_labels": labels,
                 "exp_annotations": {key: _expanded(value, labels)
                                     for key, value in rule["annotations"].items()}}
        groups.append({"name": f"{rule['alert']} fires", "interval": "1m",
                       "input_series": case["fires"],
                       "alert_rule_test": [{"eval_time": case["at"], "alertname": rule["alert"],
                                            "exp_alerts": [fired]}]})
        groups.append({"name": f"{rule['alert']} stays quiet", "interval": "1m",
                       "input_series": case["quiet"],
                       "alert_rule_test": [{"eval_time": case["at"], "alertname": rule["alert"],
                                            "exp_alerts": []}]})
    return groups


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is missing: `make deps` installs Debian's prometheus package"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


def _rule_groups(render: Any) -> list[Obj]:
    objs = render({"metrics": {"prometheusRule": {"enabled": True, "fetchFailureAlert": True}},
                   "leaderElection": {"enabled": True}}, namespace=RELEASE_NAMESPACE)
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    groups: list[Obj] = rule["spec"]["groups"]
    return groups


def _promtool_test(groups: list[Obj], work: Path) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` of these rule groups against CASES; its output in the result."""
    promtool = _promtool()
    rules = [r for group in groups for r in group["rules"]]
    (work / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (work / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": _test_groups(rules)}, width=1000))
    return subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=work,
                          capture_output=True, text=True, timeout=120)


def test_every_alert_fires_on_its_failure_and_only_then(render: Any, tmp_path: Path) -> None:
    groups = _rule_groups(render)
    rules = [r for group in groups for r in group["rules"]]
    assert {r["alert"] for r in rules} == set(CASES), "every alert needs its cases here"
    assert all(SEL in r["expr"] for r in rules if r["alert"] != "GLMModelFetchFailed")
    result = _promtool_test(groups, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_a_broken_alert_is_caught(render: Any, tmp_path: Path) -> None:
    """The harness itself: an alert whose expression no longer matches fails the run."""
    groups = _rule_groups(render)
    for rule in groups[0]["rules"]:
        if rule["alert"] == "GLMServiceRolledBack":
            rule["expr"] = rule["expr"].replace('result="RolledBack"', 'result="Rolledback"')
    result = _promtool_test(groups, tmp_path)
    assert result.returncode != 0
    assert "GLMServiceRolledBack" in result.stdout + result.stderr
