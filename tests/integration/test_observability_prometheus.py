"""The dashboard and the alert rules of deploy/observability against a real Prometheus
scraping a real reward-server under load.

A server with a reward model and a verifier (so the per-model, verifier, composite and
reward-signal series exist) and two tenants is scraped every second by Debian's
``prometheus``, which loads alerts.yml: while it is quiet, fresh from its start, every family
the dashboard and the alerts name has series but the reward signals (summaries of the items
scored: none yet). Then it gets a steady stream of /score requests from a thread; every
PromQL expression of the dashboard (its template variables filled in) and of the alert rules
evaluates without error through Prometheus's HTTP API, names only series the server
exports, and the overview, traffic, latency and reward-signal panels return data; every rule
evaluates with health ``ok``.

Without ``prometheus`` these tests skip, unless ``REWARD_SERVER_TEST_PROMETHEUS=1`` (set by
``make test``) makes the absence a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from helpers.models_files import keys_yaml
from helpers.posting import bearer
from helpers.tenants import KEY_A, KEY_B, WRONG
from observability_parts import ALERTS, DASHBOARD, alert_rules, composite_server, metric_names
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess, free_port, require_counterpart, wait_until

PROMETHEUS = shutil.which("prometheus")
require_counterpart(
    PROMETHEUS is not None, "REWARD_SERVER_TEST_PROMETHEUS", "prometheus (Debian's package)"
)

#: What Grafana puts in place of the dashboard's variables: every value of a label.
VARIABLES = {"job": ".*", "instance": ".*", "tenant": ".*", "model": ".*"}
RATE_INTERVAL = "15s"
#: Rows whose every query must return data under the load below.
ROWS_WITH_DATA = ("Overview", "Traffic and latency", "Reward signals")
#: Responses of growing length: scores and lengths vary, so the reward signals are defined.
RESPONSES = ["4", "four", "It is 4.", "The answer is four, of course.", "2 + 2 = 4, so 4 it is."]


def substitute(expr: str) -> str:
    """``expr`` as Grafana sends it: ``$__rate_interval``, ``$__interval`` and the template
    variables (``$name`` or ``${name}``) replaced."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__interval", RATE_INTERVAL)
    expr = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: VARIABLES[m.group(1) or m.group(2)], expr)
    assert "$" not in expr, expr
    return expr


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(row, panel title, expression) for every target of the dashboard."""
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = []
    row = ""
    for panel in board["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        queries += [(row, panel["title"], target["expr"]) for target in panel["targets"]]
    return queries


def variable_queries() -> list[str]:
    """The label_values(...) queries of the dashboard's query variables."""
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]


def alert_exprs() -> list[tuple[str, str]]:
    return [(rule["alert"], rule["expr"]) for rule in alert_rules()]


def named_series() -> dict[str, set[str]]:
    """The series names each dashboard query, alert and variable selects, by where."""
    used: dict[str, set[str]] = {}
    for row, title, expr in dashboard_queries():
        names = metric_names(expr)
        assert names, f"{row} / {title}: no series in {expr}"
        used.setdefault(f"{row} / {title}", set()).update(names)  # a panel's every target
    for alert, expr in alert_exprs():
        assert metric_names(expr), f"{alert}: no series in {expr}"
        used[alert] = metric_names(expr)
    for definition in variable_queries():  # label_values({__name__=~"a|b"}, label) names too
        names = set(re.findall(r"reward_server_\w+", definition))
        assert names, definition
        used[definition] = names
    return used


def family_of(name: str) -> str:
    """The family a series name belongs to (its type's suffix taken off)."""
    return re.sub(r"_(total|bucket|sum|count)$", "", name)


def exported_names(metrics_text: str) -> set[str]:
    """Every series name the server's /metrics declares (families with or without samples),
    with the suffixes of their types."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
        "summary": ("", "_sum", "_count"),
    }
    return {
        family.name + suffix
        for family in text_string_to_metric_families(metrics_text)
        for suffix in suffixes.get(family.type, ("",))
    }


# ----------------------------------------------------------------------------------------
# The server, its load and Prometheus.


@pytest.fixture(scope="module")
def server(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("observability")
    keys = keys_yaml(("alpha", KEY_A), ("beta", KEY_B))
    with composite_server(gpt2_rm, folder, keys, verifier="check") as srv:
        yield srv


@pytest.fixture(scope="module")
def load(server: ServerProcess, quiet_families: set[str]) -> Iterator[None]:
    """/score requests from both tenants until the module's tests end (a few errors too),
    once prometheus has scraped the quiet server."""
    stop = threading.Event()
    failures: list[str] = []

    def send() -> None:
        try:
            requests()
        except BaseException as exc:  # reported by the fixture's teardown
            failures.append(repr(exc))

    def requests() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            # One unauthorized and one invalid request: the error panels have series.
            http.post("/score", json={"texts": ["x"]}, headers=bearer(WRONG))
            http.post("/score", json={"texts": []}, headers=bearer(KEY_B))
            n = 0
            while not stop.is_set():
                n += 1
                padding = "more " * (n % 7)
                responses = [f"{RESPONSES[(n + i) % len(RESPONSES)]} {padding}" for i in range(4)]
                body = {
                    "queries": [f"What is 2+2? ({n})"] * 4,
                    "responses": responses,
                    "labels": ["4"] * 4,
                }
                answer = http.post("/score", json=body, headers=bearer((KEY_A, KEY_B)[n % 2]))
                if answer.status_code != 200:
                    failures.append(answer.text)
                stop.wait(0.02)

    thread = threading.Thread(target=send, name="score-load", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)
    assert not failures, failures[:3]


def query(prometheus: str, expr: str) -> dict[str, Any]:
    """Prometheus's answer to an instant query (its JSON, whatever the status)."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=30)
    return answer.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def scraping(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's prometheus scraping the server every second, with alerts.yml loaded; its URL
    once it holds a few scrapes."""
    assert PROMETHEUS is not None
    folder = tmp_path_factory.mktemp("prometheus")
    target = server.url.split("://", 1)[1]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "reward-server", "static_configs": [{"targets": [target]}]}
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (folder / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def scraped() -> bool:
            assert proc.poll() is None, (folder / "prometheus.log").read_text()[-3000:]
            try:
                # 503 "Service Unavailable" (not JSON) until its storage is open.
                if httpx.get(f"{url}/-/ready", timeout=10).status_code != 200:
                    return False
                answer = query(url, 'count_over_time(up{job="reward-server"}[1m]) >= 3')
            except httpx.TransportError:
                return False
            return bool(answer.get("data", {}).get("result"))

        wait_until(scraped, 120, "three scrapes of the server by prometheus")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def quiet_families(scraping: str) -> set[str]:
    """The families with series in prometheus after its first scrapes of the quiet server."""
    answer = query(scraping, 'group by (__name__) ({__name__=~"reward_server_.+"})')
    assert answer["status"] == "success", answer
    return {family_of(r["metric"]["__name__"]) for r in answer["data"]["result"]}


@pytest.fixture(scope="module")
def prometheus(scraping: str, load: None) -> str:
    """prometheus's URL once it holds a few scrapes of the server under load."""
    since = 'count_over_time(up{job="reward-server"}[1m]) >= 5'
    wait_until(lambda: query(scraping, since)["data"]["result"], 120, "five scrapes")
    return scraping


# ----------------------------------------------------------------------------------------
# The quiet server.


def test_every_series_named_is_there_from_the_start(quiet_families: set[str]) -> None:
    """Every family the dashboard and the alerts name has series from the first scrapes of a
    quiet server (each counter at 0, so rate() counts its first event), but the reward
    signals (quantiles, means and correlations of the items scored, of which there are none)
    and the remote components' failures (this server has none)."""
    named = {family_of(n) for names in named_series().values() for n in names} - {"up"}
    signals = {name for name in named if name.startswith("reward_server_reward_")}
    assert len(signals) == 10
    assert named - quiet_families == {*signals, "reward_server_remote_errors"}


# ----------------------------------------------------------------------------------------
# The expressions.


def test_every_dashboard_and_alert_expression_evaluates(prometheus: str) -> None:
    """Each query of the dashboard and each alert expression is valid PromQL for a real
    Prometheus (no error, no warning)."""
    exprs = [substitute(e) for _, _, e in dashboard_queries()] + [e for _, e in alert_exprs()]
    assert len(exprs) > 40
    for expr in exprs:
        answer = query(prometheus, expr)
        assert answer["status"] == "success", f"{expr}: {answer}"
        assert not answer.get("warnings"), f"{expr}: {answer['warnings']}"


def test_expressions_name_only_series_the_server_exports(
    server: ServerProcess, prometheus: str
) -> None:
    exported = exported_names(httpx.get(f"{server.url}/metrics", timeout=30).text) | {"up"}
    used = named_series()
    unknown = {where: names - exported for where, names in used.items() if names - exported}
    assert not unknown, f"series the server does not export: {unknown}"


def test_overview_traffic_latency_and_reward_panels_return_data(prometheus: str) -> None:
    """Under load every query of those rows returns series (rates over the last scrapes,
    the reward signals over the window the load filled)."""
    wanted = [(r, t, substitute(e)) for r, t, e in dashboard_queries() if r in ROWS_WITH_DATA]
    assert {r for r, _, _ in wanted} == set(ROWS_WITH_DATA)
    empty: list[str] = []

    def all_have_data() -> bool:
        empty.clear()
        for row, title, expr in wanted:
            answer = query(prometheus, expr)
            assert answer["status"] == "success", f"{expr}: {answer}"
            if not answer["data"]["result"]:
                empty.append(f"{row} / {title}: {expr}")
        return not empty

    try:
        wait_until(all_have_data, 120, "data in every overview, traffic and reward panel")
    except AssertionError as exc:
        raise AssertionError("panels without data:\n" + "\n".join(empty)) from exc


def test_both_tenants_and_both_components_show(prometheus: str) -> None:
    """The tenant and model variables have what to choose from: the reward signals carry each
    tenant, each component and the combined reward."""

    def labels(expr: str, label: str) -> set[str]:
        return {r["metric"][label] for r in query(prometheus, expr)["data"]["result"]}

    def complete() -> bool:
        items = "reward_server_reward_window_items"
        return labels(items, "tenant") == {"alpha", "beta"} and labels(items, "model") >= {
            "rm",
            "check",
        }

    wait_until(complete, 120, "reward signals for both tenants and both components")
    combined = labels("reward_server_reward_window_items", "model") - {"rm", "check"}
    assert len(combined) == 1, combined


def test_every_alert_rule_evaluates_healthy(prometheus: str) -> None:
    """Prometheus loaded alerts.yml and evaluates each rule without error."""
    expected = {alert for alert, _ in alert_exprs()}
    rules: list[dict[str, Any]] = []

    def evaluated() -> bool:
        answer = httpx.get(f"{prometheus}/api/v1/rules", timeout=30).json()
        assert answer["status"] == "success", answer
        rules[:] = [r for g in answer["data"]["groups"] for r in g["rules"]]
        return {r["name"] for r in rules} == expected and all(
            not r["lastEvaluation"].startswith("0001-") for r in rules
        )

    wait_until(evaluated, 120, "one evaluation of every rule")
    for rule in rules:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
