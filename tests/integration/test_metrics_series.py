"""What ``/metrics`` carries: every family with its type, help and labels, the series a real
server (a reward model, verifiers, a remote component, the score cache and two tenants)
exports as it starts, each at 0 (every label value known then: each model, the reasons its
kind can fail or mask with, each tenant, endpoint, status and error type), and those it
exposes after a known set of requests, so that moving where a series is kept or read cannot
drop, rename or relabel one. Also: two apps in one process keep their own series."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers.fakes import FakeModel, settings
from helpers.models_files import keys_yaml, python_verifier
from helpers.posting import bearer
from helpers.servers import serve
from helpers.tenants import KEY_A, KEY_B, WRONG
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess, free_port

from reward_server.http.app import create_app

FUNCTIONS = """
def boom(prompt, response, label):
    raise RuntimeError("a verifier bug")
"""

#: Every family /metrics carries: name -> (type, help).
FAMILIES: dict[str, tuple[str, str]] = {
    "reward_server_batch_padded_tokens": ("counter", "Padded tokens run through the model."),
    "reward_server_batch_padding_efficiency": (
        "histogram",
        "Real tokens / padded tokens per forward pass (1.0 = no padding).",
    ),
    "reward_server_batch_rows": ("histogram", "Rows per forward pass."),
    "reward_server_batches": ("counter", "Forward passes by outcome (ok or error)."),
    "reward_server_errors": ("counter", "Error answers by status and kind."),
    "reward_server_inference_seconds": ("histogram", "Duration of one forward pass."),
    "reward_server_items": ("counter", "Items scored successfully, by endpoint."),
    "reward_server_masked_items": (
        "counter",
        "Items a model gave no score (null in scores), by model and reason: a failure of an entry with on_error: mask, or the request's deadline.",
    ),
    "reward_server_model_batch_rows": ("histogram", "Rows per forward pass, by model."),
    "reward_server_model_batches": ("counter", "Forward passes by model and outcome."),
    "reward_server_model_dropped_rows": (
        "counter",
        "Rows queued for a model whose request ended before they started (client disconnected, deadline passed, another model failed): never run, by model.",
    ),
    "reward_server_model_cached_tokens": (
        "counter",
        "Prompt tokens served from the engine's prefix cache instead of computed, by model (vLLM engine).",
    ),
    "reward_server_model_inference_seconds": (
        "histogram",
        "Duration of one forward pass, by model.",
    ),
    "reward_server_model_items": ("counter", "Items scored, by model."),
    "reward_server_model_queue_items": ("gauge", "Items waiting, by model."),
    "reward_server_model_tokens": ("counter", "Tokens scored, by model."),
    "reward_server_tenant_queue_items": (
        "gauge",
        "Items waiting, by tenant, over every model (every tenant in force, and any other with "
        "items waiting).",
    ),
    "reward_server_queue_items": ("gauge", "Items waiting to be scored."),
    "reward_server_queue_wait_seconds": (
        "histogram",
        "Time an item waited before its forward pass.",
    ),
    "reward_server_ready": ("gauge", "1 when the server accepts work."),
    "reward_server_remote_errors": (
        "counter",
        "Items a remote component failed on (on_error), by model and reason (remote_error, timeout, parse_failure, or the remote's own mask reason).",
    ),
    "reward_server_reward_component_agreement": (
        "gauge",
        "Spearman rank correlation of two models' scores over the last items both scored in one request (model < other; left out under 10 items): falling = they disagree.",
    ),
    "reward_server_reward_failed_ratio": (
        "gauge",
        "Share of the window's items the model failed on (masked or filled).",
    ),
    "reward_server_reward_rubric_failed_ratio": (
        "gauge",
        "Share of a rubric judge's last items with a criterion of the category that failed one (not met, or a pitfall committed), by model, tenant and category.",
    ),
    "reward_server_reward_length_correlation": (
        "gauge",
        "Pearson correlation of score with response length over the window's scored items (left out under 10 items or without variance): rising = length hacking.",
    ),
    "reward_server_reward_masked_ratio": (
        "gauge",
        "Share of the window's items masked (no score).",
    ),
    "reward_server_reward_response_chars": (
        "gauge",
        "Quantiles of the window's response lengths (characters).",
    ),
    "reward_server_reward_response_chars_mean": ("gauge", "Mean response length (characters)."),
    "reward_server_reward_score": (
        "gauge",
        "Quantiles of the window's scores (masked items left out).",
    ),
    "reward_server_reward_score_mean": ("gauge", "Mean of the window's scores."),
    "reward_server_reward_score_stddev": ("gauge", "Standard deviation of the window's scores."),
    "reward_server_reward_window_items": (
        "gauge",
        "Items in the reward window (scored, masked or failed).",
    ),
    "reward_server_request_duration_seconds": ("histogram", "HTTP request latency by endpoint."),
    "reward_server_requests": ("counter", "HTTP requests by endpoint and status."),
    "reward_server_requests_in_progress": ("gauge", "HTTP requests being handled, by endpoint."),
    "reward_server_score_cache_bytes": (
        "gauge",
        "Bytes counted for the score cache's entries now.",
    ),
    "reward_server_score_cache_duplicates": (
        "counter",
        "Items answered by an identical item of the same request or of a request in flight (scored once), by model.",
    ),
    "reward_server_rubric_failed_items": (
        "counter",
        "Items a rubric judge scored that failed a criterion of the category (not met, or a pitfall committed), by model and category; / rubric_items = the share failing.",
    ),
    "reward_server_rubric_items": (
        "counter",
        "Items a rubric judge scored whose rubric has a criterion of the category, by model and category (uncategorised: criteria given by weight alone).",
    ),
    "reward_server_score_cache_entries": ("gauge", "Entries the score cache holds now."),
    "reward_server_score_cache_hits": (
        "counter",
        "Items answered from the score cache (scored by an earlier request), by model.",
    ),
    "reward_server_score_cache_misses": (
        "counter",
        "Rows the score cache did not hold and the model scored, by model.",
    ),
    "reward_server_tenant_errors": (
        "counter",
        "Error answers to authenticated requests, by tenant and status.",
    ),
    "reward_server_tenant_items": ("counter", "Items scored, by tenant."),
    "reward_server_tenant_queue_wait_seconds": (
        "histogram",
        "Time an item waited before its forward pass (vLLM: before vLLM got it), by tenant.",
    ),
    "reward_server_tenant_reloads": (
        "counter",
        "Reloads of the keys file by outcome (ok; error: the old tenants stay).",
    ),
    "reward_server_tenant_requests": (
        "counter",
        "HTTP requests that authenticated, by tenant, endpoint and status.",
    ),
    "reward_server_tenant_tokens": ("counter", "Tokens scored (unpadded), by tenant."),
    "reward_server_tenants": (
        "gauge",
        "Tenants now in force (the keys file's; 1 without --api-keys).",
    ),
    "reward_server_tokens": ("counter", "Tokens scored (unpadded)."),
    "reward_server_truncated_items": ("counter", "Items truncated."),
    "reward_server_verifier_errors": (
        "counter",
        "Items a verifier or judge failed on (on_error), by model and reason (timeout, crash, error, non_finite, bad_result, sandbox_error, parse_failure, deadline).",
    ),
    "reward_server_verifier_workers": ("gauge", "Live worker processes of each verifier."),
}
#: What the server below knows at start: the counted endpoints (and "other"), the statuses
#: of the error table and 200 (an authenticated request never gets 401), each error type,
#: the reasons a verifier's items fail with, the models and the tenants.
ENDPOINTS = [
    *("/classify", "/docs", "/get_reward", "/health", "/info", "/metrics", "/openapi.json"),
    *("/pooling", "/predict", "/run_code", "/score", "/seed_session", "/slime/reward"),
    *("/v1/classify", "/v1/fine_tuning/alpha/graders/run"),
    *("/v1/fine_tuning/alpha/graders/validate", "/v1/graders", "/v1/models", "/verify", "other"),
]
STATUSES = ["200", "401", "404", "413", "422", "429", "499", "500", "503"]
TENANT_STATUSES = [s for s in STATUSES if s != "401"]
ERROR_TYPES = [
    "status=401,type=unauthorized",
    "status=404,type=model_not_found",
    *(f"status=413,type={t}" for t in ("body_too_large", "steps_truncated", "text_too_long")),
    "status=413,type=too_many_items",
    *(f"status=422,type={t}" for t in ("bad_deadline", "bad_groups", "bad_label", "chat_template")),
    *(f"status=422,type={t}" for t in ("empty_text", "invalid_request", "policy_template")),
    *(f"status=422,type={t}" for t in ("response_not_found", "run_refused", "unknown_model")),
    "status=422,type=unrenderable",
    *("status=429,type=queue_full", "status=429,type=tenant_limit"),
    "status=499,type=client_disconnected",
    *("status=500,type=load_error", "status=500,type=model_error"),
    *("status=503,type=not_ready", "status=503,type=shutting_down"),
]
VERIFIER_REASONS = ["bad_result", "crash", "deadline", "error", "non_finite", "sandbox_error"]
VERIFIER_REASONS.append("timeout")
MODELS = ["model=away", "model=boom", "model=exact", "model=rm"]
TENANTS = ["tenant=alpha", "tenant=beta"]


def _by_reason(model: str, reasons: list[str]) -> list[str]:
    return [f"model={model},reason={r}" for r in reasons]


def _alike(series: list[str], *names: str) -> dict[str, list[str]]:
    """The families ``names``, each with the label sets ``series``."""
    return {name: series for name in names}


#: The label sets of each family's series as the server starts (the reward signals have none
#: until they have items).
FRESH: dict[str, list[str]] = {
    **_alike(
        [""],
        *("batch_padded_tokens", "batch_padding_efficiency", "batch_rows"),
        *("inference_seconds", "queue_items", "queue_wait_seconds", "ready"),
        *("score_cache_bytes", "score_cache_entries", "tenants", "tokens", "truncated_items"),
    ),
    "batches": ["outcome=error", "outcome=ok"],
    "tenant_reloads": ["outcome=error", "outcome=ok"],
    # Forward passes (and the score cache): the reward model.
    **_alike(
        ["model=rm"],
        *("model_batch_rows", "model_inference_seconds", "model_cached_tokens"),
        *("model_dropped_rows", "score_cache_hits", "score_cache_misses"),
        "score_cache_duplicates",
    ),
    "model_batches": ["model=rm,outcome=error", "model=rm,outcome=ok"],
    **_alike(MODELS, "model_items", "model_tokens", "model_queue_items"),
    "verifier_workers": ["model=boom", "model=exact"],
    "verifier_errors": _by_reason("boom", VERIFIER_REASONS) + _by_reason("exact", VERIFIER_REASONS),
    "remote_errors": _by_reason("away", ["deadline", "parse_failure", "remote_error", "timeout"]),
    # Every model's deadline and unclosed thinking; exact's failures too (it masks them).
    "masked_items": sorted(
        [
            *(f"model={m},reason={r}" for m in ("away", "boom", "rm") for r in ("deadline",)),
            *(f"model={m},reason=unclosed_reasoning" for m in ("away", "boom", "exact", "rm")),
            *_by_reason("exact", VERIFIER_REASONS),
        ]
    ),
    **_alike(
        TENANTS, "tenant_items", "tenant_tokens", "tenant_queue_wait_seconds", "tenant_queue_items"
    ),
    "tenant_requests": sorted(
        f"endpoint={e},status={s},{t}" for e in ENDPOINTS for s in TENANT_STATUSES for t in TENANTS
    ),
    "tenant_errors": sorted(f"status={s},{t}" for s in TENANT_STATUSES[1:] for t in TENANTS),
    "requests": [f"endpoint={e},status={s}" for e in ENDPOINTS for s in STATUSES],
    **_alike(
        [f"endpoint={e}" for e in ENDPOINTS],
        *("items", "request_duration_seconds", "requests_in_progress"),
    ),
    "errors": ERROR_TYPES,
}
FRESH = {f"reward_server_{name}": series for name, series in FRESH.items()}
#: The label sets of each family's series that :func:`_traffic` counts in (a histogram's
#: without ``le``), as ``name=value`` joined by commas.
SERIES: dict[str, list[str]] = {
    "reward_server_batch_padded_tokens": [""],
    "reward_server_batch_padding_efficiency": [""],
    "reward_server_batch_rows": [""],
    "reward_server_batches": ["outcome=ok"],
    "reward_server_errors": ["status=401,type=unauthorized", "status=422,type=invalid_request"],
    "reward_server_inference_seconds": [""],
    "reward_server_items": ["endpoint=/score"],
    "reward_server_model_batch_rows": ["model=rm"],
    "reward_server_model_batches": ["model=rm,outcome=ok"],
    "reward_server_model_inference_seconds": ["model=rm"],
    "reward_server_model_items": ["model=away", "model=boom", "model=exact", "model=rm"],
    "reward_server_model_queue_items": ["model=away", "model=boom", "model=exact", "model=rm"],
    "reward_server_model_tokens": ["model=away", "model=boom", "model=exact", "model=rm"],
    "reward_server_queue_items": [""],
    "reward_server_queue_wait_seconds": [""],
    "reward_server_ready": [""],
    "reward_server_remote_errors": ["model=away,reason=remote_error"],
    "reward_server_request_duration_seconds": [
        "endpoint=/health",
        "endpoint=/info",
        "endpoint=/metrics",
        "endpoint=/score",
    ],
    "reward_server_requests": [
        "endpoint=/health,status=200",
        "endpoint=/info,status=200",
        "endpoint=/metrics,status=200",
        "endpoint=/score,status=200",
        "endpoint=/score,status=401",
        "endpoint=/score,status=422",
    ],
    "reward_server_requests_in_progress": [
        "endpoint=/health",
        "endpoint=/info",
        "endpoint=/metrics",
        "endpoint=/score",
    ],
    "reward_server_score_cache_bytes": [""],
    "reward_server_score_cache_entries": [""],
    "reward_server_score_cache_hits": ["model=rm"],
    "reward_server_score_cache_misses": ["model=rm"],
    "reward_server_tenant_errors": ["status=422,tenant=beta"],
    "reward_server_tenant_items": ["tenant=alpha", "tenant=beta"],
    "reward_server_tenant_queue_wait_seconds": ["tenant=alpha"],
    "reward_server_tenant_requests": [
        "endpoint=/info,status=200,tenant=alpha",
        "endpoint=/score,status=200,tenant=alpha",
        "endpoint=/score,status=200,tenant=beta",
        "endpoint=/score,status=422,tenant=beta",
    ],
    "reward_server_tenant_tokens": ["tenant=alpha", "tenant=beta"],
    "reward_server_tenants": [""],
    "reward_server_tokens": [""],
    "reward_server_truncated_items": [""],
    "reward_server_verifier_errors": ["model=boom,reason=error"],
    "reward_server_verifier_workers": ["model=boom", "model=exact"],
}
#: The reward signals' series after :func:`_traffic`: every model and the combined reward,
#: for both tenants (the correlations need 10 items: none yet). Their values are checked
#: against hand computations in test_reward_signals_server.py.
REWARD_MODELS = ("away", "boom", "exact", "rm+exact+boom+away", "rm")
QUANTILES = ("0.05", "0.25", "0.5", "0.75", "0.95")
for _name in ("failed_ratio", "masked_ratio", "response_chars_mean", "score_mean"):
    SERIES[f"reward_server_reward_{_name}"] = [
        f"model={m},tenant={t}" for m in REWARD_MODELS for t in ("alpha", "beta")
    ]
SERIES["reward_server_reward_score_stddev"] = SERIES["reward_server_reward_score_mean"]
SERIES["reward_server_reward_window_items"] = SERIES["reward_server_reward_score_mean"]
for _name in ("response_chars", "score"):
    SERIES[f"reward_server_reward_{_name}"] = [
        f"model={m},quantile={q},tenant={t}"
        for m in REWARD_MODELS
        for q in QUANTILES
        for t in ("alpha", "beta")
    ]
#: The gauges after :func:`_traffic`: (name, labels) -> value.
GAUGES: dict[tuple[str, str], float] = {
    **{("reward_server_requests_in_progress", f"endpoint={e}"): 0.0 for e in ENDPOINTS},
    **{("reward_server_tenant_queue_items", t): 0.0 for t in TENANTS},
    ("reward_server_model_queue_items", "model=away"): 0.0,
    ("reward_server_model_queue_items", "model=boom"): 0.0,
    ("reward_server_model_queue_items", "model=exact"): 0.0,
    ("reward_server_model_queue_items", "model=rm"): 0.0,
    ("reward_server_queue_items", ""): 0.0,
    ("reward_server_ready", ""): 1.0,
    ("reward_server_requests_in_progress", "endpoint=/health"): 0.0,
    ("reward_server_requests_in_progress", "endpoint=/info"): 0.0,
    ("reward_server_requests_in_progress", "endpoint=/metrics"): 1.0,
    ("reward_server_requests_in_progress", "endpoint=/score"): 0.0,
    ("reward_server_score_cache_bytes", ""): 514.0,
    ("reward_server_score_cache_entries", ""): 2.0,
    ("reward_server_tenants", ""): 2.0,
    ("reward_server_verifier_workers", "model=boom"): 1.0,
    ("reward_server_verifier_workers", "model=exact"): 1.0,
}
#: Samples in all (histograms' buckets 17, 14 or 14 samples, counters' ``_created`` left
#: out): 1,116 from the start (70 unlabelled, 38 of the reward model's passes and cache, 14 by
#: model, 32 by model and reason, 44 by tenant or outcome, 918 of the HTTP layer: its
#: endpoints include the graders API's three, its error types bad_label), and the reward
#: signals' 6 x 10 + 2 x 50.
SAMPLES = 1116 + 6 * 10 + 2 * 50


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "le")


@dataclass(frozen=True)
class Scrape:
    """An exposition read: the families (type, help), each family's label sets, the gauges'
    values, the other samples' values and the number of samples (counters' ``_created``
    left out: the text format gives them families of their own, and their values are times)."""

    families: dict[str, tuple[str, str]]
    series: dict[str, list[str]]
    gauges: dict[tuple[str, str], float]
    counts: dict[tuple[str, str], float]
    samples: int


def scrape(text: str) -> Scrape:
    families: dict[str, tuple[str, str]] = {}
    series: dict[str, set[str]] = {}
    gauges: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    samples = 0
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue
        families[family.name] = (family.type, family.documentation)
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            samples += 1
            labels = _labels(sample.labels)
            series.setdefault(family.name, set()).add(labels)
            if family.type == "gauge":
                gauges[(sample.name, labels)] = sample.value
            else:
                counts[(sample.name, f"{labels},le={sample.labels.get('le', '')}")] = sample.value
    return Scrape(families, {k: sorted(v) for k, v in series.items()}, gauges, counts, samples)


@dataclass(frozen=True)
class Started:
    """The server, and its /metrics as it started (before any request but its health polls)."""

    server: ServerProcess
    fresh: str


@pytest.fixture(scope="module")
def server(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    folder = tmp_path_factory.mktemp("metrics")
    (folder / "metrics_functions.py").write_text(FUNCTIONS, encoding="utf-8")
    boom = f"{folder / 'metrics_functions.py'}:boom"
    models = [
        {"name": "rm", "model": str(gpt2_rm)},
        {"name": "exact", "kind": "verifier", "verifier": "exact", "workers": 1},
        python_verifier("boom", boom, workers=1, weight=0.0, on_error=-2.0),
        {
            "name": "away",
            "kind": "remote",
            "url": f"http://127.0.0.1:{free_port()}",
            "call_timeout_s": 0.5,
            "weight": 0.0,
            "on_error": 0.0,
        },
    ]
    (folder / "keys.yaml").write_text(keys_yaml(("alpha", KEY_A), ("beta", KEY_B)))
    keys = ("--api-keys", str(folder / "keys.yaml"))
    with serve(None, *keys, models=models, folder=folder, timeout=300) as srv:
        yield Started(srv, httpx.get(f"{srv.url}/metrics", timeout=30).text)


def _traffic(url: str) -> str:
    """A fixed set of requests; the /metrics text after them."""
    body = {"queries": ["q1", "q2"], "responses": ["4", "five"], "labels": ["4", "4"]}
    with httpx.Client(base_url=url, timeout=120) as http:
        for key in (KEY_A, KEY_A, KEY_B):  # the second and third are answered from the cache
            answer = http.post("/score", json=body, headers=bearer(key))
            assert answer.status_code == 200, answer.text
        assert http.post("/score", json=body, headers=bearer(WRONG)).status_code == 401
        assert http.post("/score", json={"texts": []}, headers=bearer(KEY_B)).status_code == 422
        assert http.get("/health").status_code == 200
        assert http.get("/info", headers=bearer(KEY_A)).status_code == 200
        http.get("/metrics")
        return http.get("/metrics").text


def test_a_started_server_exports_every_series_it_knows_at_0(server: Started) -> None:
    fresh = scrape(server.fresh)
    assert fresh.families == FAMILIES
    assert fresh.series == FRESH
    # Nothing counted yet but the health polls of the start (and this scrape in flight).
    assert {k: v for k, v in fresh.counts.items() if v and "endpoint=/health," not in k[1]} == {}
    in_flight = ("reward_server_requests_in_progress", "endpoint=/metrics")
    assert {k: v for k, v in fresh.gauges.items() if v} == {
        in_flight: 1.0,
        ("reward_server_ready", ""): 1.0,
        ("reward_server_tenants", ""): 2.0,
        ("reward_server_verifier_workers", "model=boom"): 1.0,
        ("reward_server_verifier_workers", "model=exact"): 1.0,
    }


def test_a_server_exposes_every_series_it_did(server: Started) -> None:
    after = scrape(_traffic(server.server.url))
    assert after.families == FAMILIES
    # The requests add no series to those of the start but the reward signals'.
    assert after.series == {**FRESH, **{k: v for k, v in SERIES.items() if "_reward_" in k}}
    assert all(set(v) <= set(FRESH[k]) for k, v in SERIES.items() if "_reward_" not in k)
    assert {k: v for k, v in after.gauges.items() if "_reward_" not in k[0]} == GAUGES
    assert after.samples == SAMPLES


def test_two_apps_in_one_process_keep_their_own_series() -> None:
    one = create_app(settings(), model=FakeModel())
    two = create_app(settings(), model=FakeModel())
    with TestClient(one) as first, TestClient(two) as second:
        assert first.post("/score", json={"texts": ["a", "b"]}).status_code == 200
        text_one = first.get("/metrics").text
        text_two = second.get("/metrics").text
    assert 'reward_server_items_total{endpoint="/score"} 2.0' in text_one
    assert 'reward_server_items_total{endpoint="/score"} 0.0' in text_two
    assert "reward_server_ready 1.0" in text_one and "reward_server_ready 1.0" in text_two
    assert _help_and_type(text_one) == _help_and_type(text_two)


def _help_and_type(text: str) -> set[str]:
    """The HELP and TYPE lines of every family (a counter's ``_created`` has its own once
    the counter has a child: left out)."""
    return {line for line in text.splitlines() if line.startswith("# ") and "_created " not in line}
