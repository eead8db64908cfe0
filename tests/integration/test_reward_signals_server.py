"""The reward signals of ``/metrics`` in a real server process, against hand computations.

One server holds two python verifiers whose scores the test sets through the items' labels
(``a`` weighted, ``b`` a weight-0 monitor) and a reward window of 40 items. A healthy run
(scores unrelated to the responses' length, the components agreeing) keeps the length
correlation under the alert's threshold and the agreement near 1; a hacked run of as many items
(scores rising with length, ``b`` ranking the items the other way) moves the correlation past
the threshold and the agreement below its own. Each figure equals the same statistic computed
here from the answers' own scores and the responses sent.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.servers import serve
from observability_parts import alert_threshold
from server_proc import ServerProcess, metric

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ROOT / "tests" / "verifier_functions.py"
WINDOW = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("signals")
    entries = [
        {"name": name, "kind": "verifier", "verifier": "python", "workers": 1, "weight": weight}
        | {"function": f"{FUNCTIONS}:field_{name}"}
        for name, weight in (("a", 1.0), ("b", 0.0))
    ]
    with serve(None, "--reward-window", str(WINDOW), models=entries, folder=folder) as srv:
        yield srv


def pearson(x: list[float], y: list[float]) -> float:
    mx, my = statistics.fmean(x), statistics.fmean(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    ordered = sorted(values)
    return [
        statistics.fmean(i + 1 for i, v in enumerate(ordered) if v == value) for value in values
    ]


def spearman(x: list[float], y: list[float]) -> float:
    return pearson(ranks(x), ranks(y))


def send(server: ServerProcess, responses: list[str], labels: list[dict[str, Any]]) -> dict:
    body = {"queries": ["q"] * len(responses), "responses": responses, "labels": labels}
    answer = httpx.post(f"{server.url}/score", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def signal(server: ServerProcess, name: str, **labels: str) -> float:
    return metric(server.url, f"reward_server_reward_{name}", tenant="default", **labels)


def run(server: ServerProcess, hacked: bool, seed: int) -> tuple[dict, list[float]]:
    """A window's worth of items, lengths 5..400 characters: scores unrelated to length with
    ``b`` close to ``a`` (healthy), or rising with length with ``b`` reversed (hacked). The
    answer and the responses' lengths."""
    rng = random.Random(seed)
    lengths = [rng.randint(5, 400) for _ in range(WINDOW)]
    labels = []
    for n in lengths:
        a = n / 100 + rng.gauss(0, 0.3) if hacked else rng.gauss(0, 1)
        b = -a if hacked else a + rng.gauss(0, 0.1)
        labels.append({"a": round(a, 4), "b": round(b, 4)})
    return send(server, ["x" * n for n in lengths], labels), [float(n) for n in lengths]


def test_length_correlation_and_agreement_move_from_healthy_to_hacked(
    server: ServerProcess,
) -> None:
    correlation_alert = alert_threshold(
        "RewardLengthCorrelationHigh", "reward_server_reward_length_correlation"
    )
    agreement_alert = alert_threshold(
        "RewardComponentDisagreement", "reward_server_reward_component_agreement"
    )
    for hacked, seed in ((False, 1), (True, 2)):
        answer, chars = run(server, hacked, seed)
        a, b = answer["components"]["a"], answer["components"]["b"]
        correlation = signal(server, "length_correlation", model="a")
        agreement = signal(server, "component_agreement", model="a", other="b")
        # The window holds this run's items only: the figures are this run's.
        assert correlation == pytest.approx(pearson(a, chars), abs=1e-9)
        assert agreement == pytest.approx(spearman(a, b), abs=1e-9)
        # The combined reward (b weighs 0: a's scores) has its own series.
        combined = signal(server, "length_correlation", model=answer["model"])
        assert combined == pytest.approx(pearson(answer["scores"], chars), abs=1e-9)
        if hacked:
            assert correlation > correlation_alert and agreement < agreement_alert
        else:
            assert correlation < correlation_alert and agreement > agreement_alert
        assert signal(server, "window_items", model="a") == WINDOW


def test_distribution_and_masked_share_of_the_window(server: ServerProcess) -> None:
    rng = random.Random(3)
    # 10 of the window's items fail in a (NaN: masked non_finite); b scores them all.
    labels = [
        {"a": "nan" if i % 4 == 0 else round(rng.uniform(-2, 2), 4), "b": i} for i in range(WINDOW)
    ]
    responses = ["y" * rng.randint(1, 300) for _ in range(WINDOW)]
    send(server, responses, labels)  # twice: the windows hold this test's items only
    answer = send(server, responses, labels)
    a = answer["components"]["a"]
    assert a.count(None) == 10 and answer["masked"].count("non_finite") == 10
    scored = [s for s in a if s is not None]
    chars = [float(len(r)) for r, s in zip(responses, a, strict=True) if s is not None]
    assert signal(server, "masked_ratio", model="a") == pytest.approx(10 / WINDOW)
    assert signal(server, "failed_ratio", model="a") == pytest.approx(10 / WINDOW)
    assert signal(server, "masked_ratio", model="b") == 0.0
    # The combined reward is masked where a (weighted) is.
    assert signal(server, "masked_ratio", model=answer["model"]) == pytest.approx(10 / WINDOW)
    cuts = statistics.quantiles(scored, n=20, method="inclusive")  # 5 %, 10 %, ... 95 %
    length_cuts = statistics.quantiles(chars, n=20, method="inclusive")
    for q, at in (("0.05", 0), ("0.25", 4), ("0.5", 9), ("0.75", 14), ("0.95", 18)):
        assert signal(server, "score", model="a", quantile=q) == pytest.approx(cuts[at])
        assert signal(server, "response_chars", model="a", quantile=q) == pytest.approx(
            length_cuts[at]
        )
    assert signal(server, "score_mean", model="a") == pytest.approx(statistics.fmean(scored))
    assert signal(server, "score_stddev", model="a") == pytest.approx(statistics.pstdev(scored))
    assert signal(server, "response_chars_mean", model="a") == pytest.approx(
        statistics.fmean(chars)
    )
    # Agreement reads the last 40 items both scored: 30 per request (those a did not mask).
    b = [float(x["b"]) for x, s in zip(labels, a, strict=True) if s is not None]
    assert signal(server, "component_agreement", model="a", other="b") == pytest.approx(
        spearman(scored[-10:] + scored, b[-10:] + b), abs=1e-9
    )
