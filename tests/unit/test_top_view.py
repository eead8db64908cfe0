"""``reward-server top``'s figures against hand computations: Prometheus's
``histogram_quantile`` and ``rate`` over two scrapes, the frame built from two expositions,
its rendering, and the poller's answers to a refused key and an unreachable server (through
httpx's mock transport: no socket)."""

from __future__ import annotations

import math

import httpx
import pytest
from rich.console import Console

from reward_server.top._frame import build_frame, model_names
from reward_server.top._render import render
from reward_server.top._scrape import Delta, Snapshot, histogram_quantile, increase
from reward_server.top.cli import KeyRefused, Poller, api_key

INF = math.inf
#: 40 observations: 10 up to 0.1 s, 20 in (0.1, 0.5], 10 in (0.5, 1].
BUCKETS = {0.1: 10.0, 0.5: 30.0, 1.0: 40.0, INF: 40.0}


def test_histogram_quantile_interpolates_in_the_bucket() -> None:
    # rank 20 lies in (0.1, 0.5], 10 of its 20 observations in: 0.1 + 0.4 * 10 / 20
    assert histogram_quantile(0.5, BUCKETS) == pytest.approx(0.3)
    # rank 36: (0.5, 1], 6 of 10 in: 0.5 + 0.5 * 6 / 10
    assert histogram_quantile(0.9, BUCKETS) == pytest.approx(0.8)
    # rank 2 in the first bucket, whose lower bound is 0: 0.1 * 2 / 10
    assert histogram_quantile(0.05, BUCKETS) == pytest.approx(0.02)
    # bucket order does not matter
    assert histogram_quantile(0.5, dict(reversed(BUCKETS.items()))) == pytest.approx(0.3)


def test_histogram_quantile_edges_as_prometheus() -> None:
    # a rank in the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.99, {0.1: 10.0, 0.25: 15.0, INF: 20.0}) == 0.25
    # no observations, or no +Inf bucket: nothing to say
    assert histogram_quantile(0.5, {0.1: 0.0, INF: 0.0}) is None
    assert histogram_quantile(0.5, {0.1: 3.0, 1.0: 4.0}) is None
    assert histogram_quantile(0.5, {}) is None
    # outside [0, 1]
    assert histogram_quantile(-0.1, BUCKETS) == -INF
    assert histogram_quantile(1.5, BUCKETS) == INF
    # counts that are not monotonic are repaired (the max so far: 10, 10, 20, 20): rank 15
    # lies in (0.5, 1], 5 of its 10 in
    broken = {0.1: 10.0, 0.5: 8.0, 1.0: 20.0, INF: 20.0}
    assert histogram_quantile(0.75, broken) == pytest.approx(0.75)
    # a first bucket with a bound <= 0 answers its bound
    assert histogram_quantile(0.1, {0.0: 5.0, 1.0: 10.0, INF: 10.0}) == 0.0


def test_counter_increase_takes_a_reset_as_a_restart_from_zero() -> None:
    assert increase(15.0, 10.0) == 5.0
    assert increase(3.0, 10.0) == 3.0  # the server restarted
    assert increase(7.0, None) == 7.0


def _traffic(
    ok: int, limited: int, polls: int, items: int, buckets: tuple[int, ...], seconds: int
) -> str:
    """One scrape's request counts (/score's 200s and 429s, /metrics's polls), items and
    /score's latency histogram (cumulative counts at 0.1, 0.5 and 1 s, none slower; their
    sum of ``seconds``)."""
    b01, b05, b1 = buckets
    return f"""\
# TYPE reward_server_requests counter
reward_server_requests_total{{endpoint="/score",status="200"}} {ok}
reward_server_requests_total{{endpoint="/score",status="429"}} {limited}
reward_server_requests_total{{endpoint="/metrics",status="200"}} {polls}
# TYPE reward_server_items counter
reward_server_items_total{{endpoint="/score"}} {items}
# TYPE reward_server_request_duration_seconds histogram
reward_server_request_duration_seconds_bucket{{endpoint="/score",le="0.1"}} {b01}
reward_server_request_duration_seconds_bucket{{endpoint="/score",le="0.5"}} {b05}
reward_server_request_duration_seconds_bucket{{endpoint="/score",le="1.0"}} {b1}
reward_server_request_duration_seconds_bucket{{endpoint="/score",le="+Inf"}} {b1}
reward_server_request_duration_seconds_count{{endpoint="/score"}} {b1}
reward_server_request_duration_seconds_sum{{endpoint="/score"}} {seconds}
"""


BEFORE = (
    _traffic(100, 2, 50, 400, (60, 90, 102), 20)
    + """\
# TYPE reward_server_tenant_items counter
reward_server_tenant_items_total{tenant="alpha"} 300
reward_server_tenant_items_total{tenant="beta"} 100
# TYPE reward_server_model_items counter
reward_server_model_items_total{model="rm"} 400
reward_server_model_items_total{model="exact"} 400
"""
)

NOW = (
    _traffic(116, 6, 51, 480, (65, 105, 122), 25)
    + """\
# TYPE reward_server_requests_in_progress gauge
reward_server_requests_in_progress{endpoint="/score"} 3
reward_server_requests_in_progress{endpoint="/metrics"} 1
# TYPE reward_server_queue_items gauge
reward_server_queue_items 7
# TYPE reward_server_ready gauge
reward_server_ready 1
# TYPE reward_server_tenant_items counter
reward_server_tenant_items_total{tenant="alpha"} 360
reward_server_tenant_items_total{tenant="beta"} 120
# TYPE reward_server_tenant_requests counter
reward_server_tenant_requests_total{tenant="alpha",endpoint="/score",status="200"} 12
# TYPE reward_server_tenant_queue_items gauge
reward_server_tenant_queue_items{tenant="alpha"} 7
# TYPE reward_server_model_items counter
reward_server_model_items_total{model="rm"} 480
reward_server_model_items_total{model="exact"} 470
# TYPE reward_server_model_queue_items gauge
reward_server_model_queue_items{model="rm"} 5
reward_server_model_queue_items{model="exact"} 2
# TYPE reward_server_verifier_errors counter
reward_server_verifier_errors_total{model="exact",reason="timeout"} 4
# TYPE reward_server_reward_window_items gauge
reward_server_reward_window_items{model="rm",tenant="alpha"} 360
# TYPE reward_server_reward_score gauge
reward_server_reward_score{model="rm",tenant="alpha",quantile="0.05"} -2.5
reward_server_reward_score{model="rm",tenant="alpha",quantile="0.25"} -1
reward_server_reward_score{model="rm",tenant="alpha",quantile="0.5"} 0.25
reward_server_reward_score{model="rm",tenant="alpha",quantile="0.75"} 1.5
reward_server_reward_score{model="rm",tenant="alpha",quantile="0.95"} 3
# TYPE reward_server_reward_score_mean gauge
reward_server_reward_score_mean{model="rm",tenant="alpha"} 0.3
# TYPE reward_server_reward_length_correlation gauge
reward_server_reward_length_correlation{model="rm",tenant="alpha"} 0.72
# TYPE reward_server_reward_masked_ratio gauge
reward_server_reward_masked_ratio{model="rm",tenant="alpha"} 0.05
# TYPE reward_server_reward_component_agreement gauge
reward_server_reward_component_agreement{model="exact",other="rm",tenant="alpha"} 0.1
"""
)


def _pair() -> tuple[Snapshot, Snapshot]:
    """The two scrapes, 4 s apart."""
    return Snapshot.parse(BEFORE, 100.0), Snapshot.parse(NOW, 104.0)


def test_rates_and_latency_between_two_scrapes() -> None:
    before, now = _pair()
    delta = Delta(before, now)
    assert delta.seconds == 4.0
    assert delta.rate("reward_server_items_total") == 20.0  # (480 - 400) / 4
    assert delta.rate("reward_server_requests_total", endpoint="/score") == 5.0  # 20 / 4
    assert delta.rates_by("reward_server_tenant_items_total", "tenant") == {
        "alpha": 15.0,
        "beta": 5.0,
    }
    assert delta.rate("reward_server_no_such_total") is None
    # the interval's observations: 5 up to 0.1 s, 10 in (0.1, 0.5], 5 in (0.5, 1]
    assert delta.bucket_increase("reward_server_request_duration_seconds") == {
        0.1: 5.0,
        0.5: 15.0,
        1.0: 20.0,
        INF: 20.0,
    }
    # p50: rank 10 in (0.1, 0.5], 5 of 10: 0.3; p90: rank 18 in (0.5, 1], 3 of 5: 0.8
    assert delta.quantile(0.5, "reward_server_request_duration_seconds") == pytest.approx(0.3)
    assert delta.quantile(0.9, "reward_server_request_duration_seconds") == pytest.approx(0.8)
    # a restarted server: the new counts are all new
    restarted = Snapshot.parse(BEFORE.replace(" 400\n", " 40\n"), 108.0)
    assert Delta(now, restarted).rate("reward_server_items_total") == 10.0  # 40 / 4


def test_frame_from_two_scrapes() -> None:
    before, now = _pair()
    info = {"models": [{"name": "rm"}, {"name": "exact"}], "version": "0.1.0"}
    assert model_names(info) == ["rm+exact", "rm", "exact"]
    frame = build_frame("http://h:8000", 2.0, info, now, before)
    assert frame.ready is True and frame.queued == 7 and frame.seconds == 4.0
    assert (frame.items, frame.items_s) == (480, 20.0)
    # /metrics (the view's own polls) is not work: 122 /score requests, 20 in the interval
    assert (frame.requests, frame.requests_s) == (122, 5.0)
    assert frame.errors_s == 1.0 and frame.error_ratio == pytest.approx(0.2)  # 4 429s / 20
    assert frame.in_progress == 3
    [score] = frame.endpoints
    assert score.endpoint == "/score" and score.latency[:2] == pytest.approx((0.3, 0.8))
    assert score.latency[2] == pytest.approx(0.5 + 0.5 * (19.8 - 15) / 5)
    tenants = {row.tenant: row for row in frame.tenants}
    assert tenants["alpha"].items_s == 15.0 and tenants["alpha"].queued == 7
    assert tenants["alpha"].requests_s == 3.0  # 12 new (none before) / 4
    assert tenants["beta"].items_s == 5.0 and tenants["beta"].queued == 0
    models = {row.model: row for row in frame.models}
    assert [row.model for row in frame.models] == ["rm", "exact"]
    assert models["rm"].items_s == 20.0 and models["rm"].queued == 5
    assert models["exact"].items_s == 17.5 and models["exact"].failed_s == 1.0
    # reward signals: rm for alpha has them; the combined reward and exact have none
    rewards = {(row.model, row.tenant): row for row in frame.rewards}
    assert [row.model for row in frame.rewards] == ["rm+exact", "rm", "exact"]
    rm = rewards["rm", "alpha"]
    assert rm.window == 360 and rm.quantiles == (-2.5, -1.0, 0.25, 1.5, 3.0)
    assert (rm.mean, rm.length_correlation, rm.masked_ratio) == (0.3, 0.72, 0.05)
    assert rm.stddev is None  # a series the server does not export stays empty
    assert rewards["exact", ""].window is None
    [agreement] = frame.agreements
    assert (agreement.model, agreement.other, agreement.value) == ("exact", "rm", 0.1)


def test_the_first_frame_has_totals_and_no_rates_yet() -> None:
    _, now = _pair()
    frame = build_frame("http://h:8000", 2.0, {}, now, None)
    assert frame.items == 480 and frame.items_s is None and frame.error_ratio is None
    assert frame.endpoints[0].latency == (None, None, None)
    assert all(row.items_s is None for row in frame.tenants)


def _screen(frame: object) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(render(frame))  # type: ignore[arg-type]
    return console.export_text()


def test_render_shows_the_figures_and_no_data() -> None:
    before, now = _pair()
    info = {"models": [{"name": "rm"}, {"name": "exact"}], "version": "0.1.0"}
    screen = _screen(build_frame("http://h:8000", 2.0, info, now, before))
    assert "model rm+exact (rm, exact)" in screen and "ready" in screen
    assert "items/s 20.0" in screen and "error rate 20.0%" in screen
    assert "300 ms" in screen and "800 ms" in screen  # p50 and p90 of /score
    score_row = next(line for line in screen.splitlines() if "/score" in line)
    assert score_row.split()[:4] == ["/score", "5.0", "20.0", "1.0"]
    reward_row = next(line for line in screen.splitlines() if "+0.72" in line)
    assert reward_row.split()[:8] == [
        "rm",
        "alpha",
        "360",
        "-2.50",
        "-1.00",
        "0.25",
        "1.50",
        "3.00",
    ]
    assert "5.0%" in reward_row  # masked ratio
    assert screen.count("no data") == 2  # rm+exact and exact
    assert "exact~rm [alpha] +0.10" in screen
    first = _screen(build_frame("http://h:8000", 2.0, info, now, None))
    assert "items/s …" in first and "items total 480" in first


def test_a_problem_replaces_the_figures() -> None:
    poller = Poller("http://h:1", None, 2.0, transport=httpx.MockTransport(_refuse))
    frame, scrape = poller.poll(None)
    assert scrape is None
    assert frame.problem == "cannot reach http://h:1: connection refused; retrying every 2 s"
    assert "cannot reach http://h:1: connection refused" in _screen(frame)
    poller.close()


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def _server(status_info: int, status_metrics: int = 200) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            if request.headers.get("authorization") != "Bearer good":
                return httpx.Response(status_info, json={"error": "unauthorized"})
            return httpx.Response(200, json={"models": [{"name": "rm"}]})
        return httpx.Response(status_metrics, text=NOW)

    return httpx.MockTransport(answer)


def test_a_refused_key_is_said_clearly() -> None:
    for key, status, said in (
        ("bad", 401, "the API key was refused (401)"),
        (None, 401, "the server needs an API key (401)"),
        ("bad", 403, "the API key was refused (403)"),
    ):
        poller = Poller("http://h:1", key, 2.0, transport=_server(status))
        with pytest.raises(KeyRefused) as refused:
            poller.poll(None)
        assert str(refused.value) == f"{said}: pass --api-key or set REWARD_SERVER_API_KEY"
    good = Poller("http://h:1", "good", 2.0, transport=_server(401))
    frame, scrape = good.poll(None)
    assert scrape is not None and frame.problem is None and frame.info["models"]
    down = Poller("http://h:1", "good", 2.0, transport=_server(401, status_metrics=503))
    assert down.poll(None)[0].problem == "/metrics answered 503; retrying every 2 s"


def test_the_key_comes_from_the_flag_then_the_environment() -> None:
    env = {"REWARD_API_KEY": "client", "REWARD_SERVER_API_KEY": "server"}
    assert api_key("flag", env) == "flag"
    assert api_key(None, env) == "server"
    assert api_key(None, {"REWARD_API_KEY": "client"}) == "client"
    assert api_key(None, {"REWARD_SERVER_API_KEY": ""}) is None
