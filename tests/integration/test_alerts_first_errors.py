"""The first errors after a quiet start fire their alerts, on series as a freshly started server
exports them (``promtool test rules`` over deploy/observability/alerts.yml).

A real server (a python verifier that fails on the label ``"fail"``, two tenants) is scraped
once as it starts, before any request. Then, one scrape after each event: a request of one
tenant whose two items verify and fail; a few minutes in, a keys file that does not load.
Those scrapes, as they are, become the input series of a rule test, one minute apart, after
twenty quiet minutes of the first scrape: no alert fires on the quiet server, and each alert
on those errors fires as early as its rule allows, counting the first error (the verifier
failures its ``for`` after the first failed items, the keys file at the failed reload). The
same scrapes with every counter left out until it is first non-zero (the way the server
exported them before its series existed from the start) fire neither then, and the keys-file
alert never: ``rate()`` and ``increase()`` never count the first event of a series that
appears with it.

``promtool`` comes with Debian's ``prometheus`` package; without it these tests skip, unless
``REWARD_SERVER_TEST_PROMETHEUS=1`` (set by ``make test``) makes the absence a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from helpers.models_files import python_verifier, write_keys
from helpers.servers import serve
from observability_parts import ALERTS, alert_rules, metric_names, promtool_result
from observability_parts import promtool as find_promtool
from prometheus_client.parser import text_string_to_metric_families
from server_proc import metric, wait_until

from reward_server.config.tenants import hash_key

FUNCTIONS = """
def flaky(prompt, response, label):
    if label == "fail":
        raise RuntimeError("a verifier bug")
    return 1.0
"""
KEYS = {"alpha": "alpha-key-first-errors", "beta": "beta-key-first-errors"}
#: Minutes of the first scrape before the first error, and of errors after it.
QUIET, ERRORS = 20, 15
#: The error minute at which the keys file stops loading.
RELOAD_AT = 3
#: The labels Prometheus adds to every scraped series.
TARGET = {"job": "reward-server", "instance": "rs:8000"}

Series = tuple[str, tuple[tuple[str, str], ...]]


@pytest.fixture(scope="module")
def promtool() -> str:
    return find_promtool()


def keys_file(path: Path) -> None:
    entries = [{"name": name, "key_sha256": hash_key(key)} for name, key in KEYS.items()]
    write_keys(path.parent, entries, name=path.name)


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """/metrics of a fresh server, then after each of its first errors (one a minute)."""
    folder = tmp_path_factory.mktemp("first_errors")
    (folder / "first_errors.py").write_text(FUNCTIONS, encoding="utf-8")
    function = f"{folder / 'first_errors.py'}:flaky"
    flaky = python_verifier("flaky", function, workers=1)
    keys = folder / "keys.yaml"
    keys_file(keys)
    with serve(None, "--api-keys", str(keys), models=[flaky], folder=folder, timeout=300) as server:
        url = server.url

        def reload_failed() -> bool:
            return metric(url, "reward_server_tenant_reloads_total", outcome="error") == 1

        with httpx.Client(base_url=url, timeout=60) as http:
            texts = [http.get("/metrics").text]
            body = {"texts": ["one", "two"], "labels": ["pass", "fail"]}
            auth = {"Authorization": f"Bearer {KEYS['alpha']}"}
            for minute in range(1, ERRORS + 1):
                answer = http.post("/score", json=body, headers=auth)
                assert answer.status_code == 200, answer.text
                assert answer.json()["scores"][1] is None, answer.text
                if minute == RELOAD_AT:
                    keys.write_text("tenants: [not a tenant]\n", encoding="utf-8")
                    wait_until(reload_failed, 60, "the failed reload of the keys file")
                texts.append(http.get("/metrics").text)
        yield texts


def samples(text: str, names: set[str]) -> dict[Series, float]:
    """The samples of ``names`` in one exposition, with the target's labels."""
    found: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                labels = tuple(sorted({**sample.labels, **TARGET}.items()))
                found[(sample.name, labels)] = sample.value
    return found


def input_series(texts: list[str], *, appear_at_first_count: bool) -> list[dict[str, str]]:
    """promtool's input series, one sample a minute: the first scrape from 0 to
    :data:`QUIET` minutes, then the scrape after the errors of minute m at ``QUIET + m``.
    ``appear_at_first_count``: a counter is absent until it is first non-zero."""
    names = set().union(*(metric_names(rule["expr"]) for rule in alert_rules())) - {"up"}
    minutes = [samples(texts[0], names)] * (QUIET + 1) + [samples(t, names) for t in texts[1:]]
    out = [
        {"series": _selector("up", tuple(sorted(TARGET.items()))), "values": f"1x{len(minutes)}"}
    ]
    for series in sorted(set().union(*minutes)):
        values = [minute.get(series) for minute in minutes]
        if appear_at_first_count and series[0].endswith("_total"):
            first = next((i for i, v in enumerate(values) if v), len(values))
            values = [None] * first + values[first:]
        out.append(
            {
                "series": _selector(*series),
                "values": " ".join("_" if v is None else repr(v) for v in values),
            }
        )
    return out


def _selector(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    """``name{label="value", ...}``, the values escaped as PromQL strings."""
    pairs = (f"{k}={json.dumps(v)}" for k, v in labels)
    return name + "{" + ", ".join(pairs) + "}"


def expected(alert: str, value: str, **labels: str) -> dict[str, Any]:
    """The alert ``alert`` as it fires with ``labels`` (its annotations rendered by hand)."""
    (rule,) = [r for r in alert_rules() if r["alert"] == alert]
    every = {**TARGET, **labels}

    def render(template: str) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: every[m.group(1)], template)
        return re.sub(r"\{\{ \$value[^}]*\}\}", value, text)

    return {
        "exp_labels": {**every, **rule["labels"]},
        "exp_annotations": {k: render(v) for k, v in rule["annotations"].items()},
    }


def run_rule_test(
    promtool: str, folder: Path, series: list[dict[str, str]], cases: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    shutil.copy(ALERTS, folder / ALERTS.name)
    test = {
        "rule_files": [ALERTS.name],
        "evaluation_interval": "1m",
        "tests": [{"name": "first errors", "interval": "1m", "input_series": series,
                   "alert_rule_test": cases}],
    }  # fmt: skip
    (folder / "first_errors.test.yml").write_text(yaml.safe_dump(test), encoding="utf-8")
    return promtool_result(promtool, "test", "rules", "first_errors.test.yml", cwd=folder)


def first_firing(alert: str) -> str:
    """When ``alert`` fires at the earliest on errors from the first error minute on: its
    ``for`` after that minute (the keys-file alert has none: at the failed reload)."""
    if alert == "RewardServerKeysReloadFailed":
        return f"{QUIET + RELOAD_AT}m"
    (rule,) = [r for r in alert_rules() if r["alert"] == alert]
    return f"{QUIET + 1 + int(rule['for'].removesuffix('m'))}m"


#: The alerts on the first errors, as they fire on them.
FIRING = {
    "RewardServerVerifierFailures": ("50%", {"model": "flaky"}),
    "RewardServerKeysReloadFailed": ("", {"outcome": "error"}),
}


def test_the_first_errors_after_a_quiet_start_fire_their_alerts(
    promtool: str, scrapes: list[str], tmp_path: Path
) -> None:
    """Nothing fires on the quiet server; each alert on the first errors fires as early as
    its rule allows, counting the first error."""
    quiet = [
        {"eval_time": f"{QUIET}m", "alertname": rule["alert"], "exp_alerts": []}
        for rule in alert_rules()
    ]
    firing = [
        {
            "eval_time": first_firing(alert),
            "alertname": alert,
            "exp_alerts": [expected(alert, value, **labels)],
        }
        for alert, (value, labels) in FIRING.items()
    ]
    series = input_series(scrapes, appear_at_first_count=False)
    result = run_rule_test(promtool, tmp_path, series, quiet + firing)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_first_scrape_holds_the_counted_series_at_0(scrapes: list[str]) -> None:
    """The rule test above reads the failures, items and reloads from 0 on."""
    names = {"reward_server_verifier_errors_total", "reward_server_model_items_total"}
    fresh = samples(scrapes[0], {*names, "reward_server_tenant_reloads_total"})
    target = tuple(TARGET.items())
    for name, labels in [
        ("reward_server_verifier_errors_total", (("model", "flaky"), ("reason", "error"))),
        ("reward_server_model_items_total", (("model", "flaky"),)),
        ("reward_server_tenant_reloads_total", (("outcome", "error"),)),
    ]:
        assert fresh[(name, tuple(sorted((*labels, *target))))] == 0.0, name


def test_on_series_that_appear_with_their_first_count_the_first_errors_are_missed(
    promtool: str, scrapes: list[str], tmp_path: Path
) -> None:
    """The same events on series absent until their first count (as the server exported them
    before): at the same times, neither alert fires; the keys-file alert never does (its
    one failure is the first sample of its series, never an increase)."""
    silent = [
        {"eval_time": when, "alertname": alert, "exp_alerts": []}
        for alert in FIRING
        for when in (first_firing(alert), f"{QUIET + ERRORS}m")
        if alert == "RewardServerKeysReloadFailed" or when == first_firing(alert)
    ]
    series = input_series(scrapes, appear_at_first_count=True)
    result = run_rule_test(promtool, tmp_path, series, silent)
    assert result.returncode == 0, result.stdout + result.stderr
