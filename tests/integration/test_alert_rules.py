"""deploy/observability checked offline: the alert rules under ``promtool check rules`` and
``promtool test rules`` (a case where each alert fires and one where it stays quiet), the
scrape config under ``promtool check config``, the Kubernetes PrometheusRule equal to the
rules, and the Grafana dashboard's structure (importable, one datasource variable, the rows
of the issue, the alert thresholds drawn where the alerts use them).

``promtool`` comes with Debian's ``prometheus`` package (``make setup`` installs it where it
can); without it the promtool tests skip, unless ``REWARD_SERVER_TEST_PROMETHEUS=1`` (set by
``make test``) makes the absence a failure.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from observability_parts import (
    ALERTS,
    DASHBOARD,
    OBSERVABILITY,
    ROOT,
    alert_rules,
    alert_threshold,
    promtool_result,
    run_promtool,
)
from observability_parts import promtool as find_promtool

from reward_server.top._render import AGREEMENT_ALERT, LENGTH_CORRELATION_ALERT

ALERT_TESTS = OBSERVABILITY / "alerts.test.yml"
PROMETHEUS_RULE = ROOT / "deploy/kubernetes/components/servicemonitor/prometheusrule.yaml"
#: The alerts the issue asks for (server down, 5xx, p99 latency, 429, verifier failures,
#: keys-file reloads, length correlation, component disagreement), and not-ready.
ALERT_NAMES = {
    "RewardServerDown",
    "RewardServerNotReady",
    "RewardServerErrors",
    "RewardServerSlowRequests",
    "RewardServerRejectingRequests",
    "RewardServerVerifierFailures",
    "RewardServerKeysReloadFailed",
    "RewardLengthCorrelationHigh",
    "RewardComponentDisagreement",
}
ROWS = [
    "Overview",
    "Traffic and latency",
    "Batching and queue",
    "Engines",
    "Score cache",
    "Verifiers and sandbox",
    "Reward signals",
]
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


@pytest.fixture(scope="module")
def promtool() -> str:
    return find_promtool()


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def panels_by_row() -> dict[str, list[dict[str, Any]]]:
    """The dashboard's panels under each row's title, in order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        else:
            assert current is not None, f"{panel['title']} is above every row"
            current.append(panel)
    return rows


# ----------------------------------------------------------------------------------------
# promtool


def test_promtool_checks_the_rules(promtool: str) -> None:
    out = run_promtool(promtool, "check", "rules", ALERTS.name)
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in out


def test_promtool_checks_the_scrape_config(promtool: str) -> None:
    """prometheus.yml is valid and loads alerts.yml (its rule_files)."""
    out = run_promtool(promtool, "check", "config", "prometheus.yml")
    assert "SUCCESS: 1 rule files found" in out


def test_every_alert_fires_and_stays_quiet_under_promtool(promtool: str) -> None:
    assert "SUCCESS" in run_promtool(promtool, "test", "rules", ALERT_TESTS.name)


def test_promtool_unit_tests_catch_a_wrong_expectation(promtool: str, tmp_path: Path) -> None:
    """A firing case expecting silence fails: the unit tests are not a no-op."""
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    cases = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    firing = next(c for t in cases["tests"] for c in t["alert_rule_test"] if c["exp_alerts"])
    firing["exp_alerts"] = []
    (tmp_path / ALERT_TESTS.name).write_text(yaml.safe_dump(cases), encoding="utf-8")
    result = promtool_result(promtool, "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert firing["alertname"] in result.stdout + result.stderr


# ----------------------------------------------------------------------------------------
# The rules and their unit tests, read as YAML.


def test_the_rules_are_the_issues_alerts() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)) and set(names) == ALERT_NAMES
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    """alerts.test.yml has, for every alert, a case expecting it and a case expecting none,
    each on series of its own."""
    cases = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    assert cases["rule_files"] == [ALERTS.name]
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in cases["tests"]:
        assert test["input_series"], test["name"]
        for case in test["alert_rule_test"]:
            if case["exp_alerts"]:
                assert all(a["exp_labels"]["severity"] for a in case["exp_alerts"])
                firing.add(case["alertname"])
            else:
                quiet.add(case["alertname"])
    assert firing == ALERT_NAMES, f"no firing case for {ALERT_NAMES - firing}"
    assert quiet == ALERT_NAMES, f"no quiet case for {ALERT_NAMES - quiet}"


def test_prometheus_rule_carries_the_same_rules() -> None:
    """The Kubernetes component's copy (kustomize reads no file outside its folder) equals
    alerts.yml; tests/integration/test_kubernetes.py checks the rendered one too."""
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]


# ----------------------------------------------------------------------------------------
# The dashboard.


def test_dashboard_is_importable_with_one_datasource_variable() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("job", "instance", "tenant", "model"):
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"] == DATASOURCE
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["description"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"], panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_dashboard_has_the_rows_of_the_issue() -> None:
    rows = panels_by_row()
    assert list(rows) == ROWS
    assert all(rows.values())
    text = {row: json.dumps(panels) for row, panels in rows.items()}
    for row, names in {
        "Traffic and latency": ["tenant_requests_total", "request_duration_seconds_bucket"],
        "Batching and queue": ["queue_items", "batch_rows", "queue_wait_seconds"],
        "Engines": ["model_batches_total", "batch_padding_efficiency", "model_cached_tokens_total"],
        "Score cache": ["score_cache_hits_total", "score_cache_misses_total"],
        "Verifiers and sandbox": [
            "verifier_errors_total",
            "verifier_workers",
            "masked_items_total",
            "model_dropped_rows_total",
        ],
        "Reward signals": [
            "reward_score{",
            "reward_score_mean",
            "reward_score_stddev",
            "reward_response_chars",
            "reward_length_correlation",
            "reward_component_agreement",
            "reward_masked_ratio",
            "reward_failed_ratio",
        ],
    }.items():
        for name in names:
            assert f"reward_server_{name}" in text[row], f"{row} shows no {name}"


@pytest.mark.parametrize(
    ("title", "alert", "metric"),
    [
        ("Score-length correlation", "RewardLengthCorrelationHigh", "length_correlation"),
        ("Component agreement", "RewardComponentDisagreement", "component_agreement"),
    ],
)
def test_reward_panels_draw_the_alert_thresholds(title: str, alert: str, metric: str) -> None:
    (panel,) = [p for p in panels_by_row()["Reward signals"] if p["title"] == title]
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    steps = [s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None]
    assert steps == [alert_threshold(alert, metric)]


@pytest.mark.parametrize(
    ("shown", "alert", "metric"),
    [
        (LENGTH_CORRELATION_ALERT, "RewardLengthCorrelationHigh", "length_correlation"),
        (AGREEMENT_ALERT, "RewardComponentDisagreement", "component_agreement"),
    ],
)
def test_the_terminal_view_marks_the_alert_thresholds(
    shown: float, alert: str, metric: str
) -> None:
    """``reward-server top`` shows a figure in red past the alert's own threshold."""
    assert shown == alert_threshold(alert, metric)
