"""Prime Intellect's ``verifiers`` 0.4 as a client (issue 51): a ``vf.Task`` whose rewards are
:mod:`reward_client.integrations.verifiers` scores rollouts through a real reward server
serving a rubric judge, by verifiers' own ``Task.score`` (in a subprocess whose path holds
verifiers: it pins ``openai<3``; :mod:`helpers.drivers`). Each trace's reward equals the
server's answer to the same item; the judge's criteria are the trace's metrics; a rollout the
server masked errors (verifiers' ``TaskError``, no reward), alone and in a group; a config-plugged
reward (``rewards.<name>.fn``) reads the server from the environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import rubrics
from helpers.drivers import require_verifiers, run_driver
from helpers.judges import ATOL, judge_entry
from helpers.servers import serve
from server_proc import ServerProcess

DRIVER = Path(__file__).resolve().parents[1] / "verifiers_driver.py"
REPLIES = ["Paris.", "Lyon, I think.", "Paris, by the Seine."]
#: The first test rubric without its required criterion (no item gated to the minimum).
RUBRIC = [{k: v for k, v in c.items() if k != "required"} for c in rubrics.RUBRICS[0]]


@pytest.fixture(scope="module")
def verifiers_path() -> str:
    return require_verifiers()


@pytest.fixture(scope="module")
def server(
    judges: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A rubric judge (weight 1), a plain judge (0.5) and a rubric judge whose generated
    verdicts never parse (weight 0: it masks every item, alone)."""
    folder = judges["gpt2"]
    entries = [
        rubrics.entry(folder),
        {
            **judge_entry(folder, weight=0.5, template="Q: {{ prompt }} A: {{ response }}"),
            "name": "plain",
        },
        rubrics.entry(
            folder,
            name="strict",
            weight=0.0,
            verdict="generate",
            verdict_pattern="VERDICT=(yes|no)",
            max_new_tokens=2,
        ),
    ]
    with serve(
        None, "--max-wait-ms", "1", models=entries, folder=tmp_path_factory.mktemp("vf")
    ) as srv:
        yield srv


def _server_answer(server: ServerProcess, replies: list[str], **extra: Any) -> dict[str, Any]:
    body = {
        "queries": [rubrics.QUERIES[0]] * len(replies),
        "responses": replies,
        "labels": [RUBRIC] * len(replies),
        "components": True,
        **extra,
    }
    r = httpx.post(f"{server.url}/score", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_verifiers_task_scores_through_the_server(
    server: ServerProcess, verifiers_path: str, tmp_path: Path
) -> None:
    case = {
        "url": server.url,
        "items": [{"prompt": rubrics.QUERIES[0], "reply": r, "rubric": RUBRIC} for r in REPLIES],
    }
    env = {"REWARD_URL": server.url, "REWARD_MODEL": "rubric"}
    got = run_driver(DRIVER, case, tmp_path, verifiers_path, env=env)
    assert got["version"] == "0.4.0"
    want = _server_answer(server, REPLIES)
    rubric, plain = want["components"]["rubric"], want["components"]["plain"]
    assert len(set(rubric)) == 3  # the replies score apart
    for i, item in enumerate(got["items"]):
        task = item["task"]
        assert task["error"] is None, task
        # @vf.reward rubric (weight 1) and parts (weight 2: {parts/model: weight * score}).
        assert task["rewards"]["rubric"] == [pytest.approx(rubric[i], abs=ATOL), 1.0]
        assert "parts" not in task["rewards"]  # a mapping's keys replace the function's
        assert task["rewards"]["parts/rubric"] == [pytest.approx(rubric[i], abs=ATOL), 2.0]
        assert task["rewards"]["parts/plain"] == [pytest.approx(0.5 * plain[i], abs=ATOL), 2.0]
        # The criteria's probabilities of yes, as the trace's metrics.
        criteria = want["criteria"]["rubric"][i]
        for j, c in enumerate(criteria):
            for prefix in ("rubric/rubric", "parts/rubric"):
                assert task["metrics"][f"{prefix}/{j}"] == pytest.approx(c["probability"], abs=ATOL)
        # The plugged function, configured by the environment (REWARD_MODEL=rubric).
        plugged = item["plugged"]
        assert plugged["error"] is None, plugged
        assert plugged["rewards"]["plugged"][0] == pytest.approx(rubric[i], abs=ATOL)
        # A masked rollout errors: verifiers' TaskError naming the reason; no reward.
        strict = item["strict"]
        assert strict["error"].startswith("TaskError"), strict
        assert "masked the rollout (parse_failure)" in strict["error"]
        assert strict["rewards"]["strict"] is None
    assert got["masked_reward_is"] == "RewardClientError"


def test_a_group_of_rollouts_is_one_request(
    server: ServerProcess, verifiers_path: str, tmp_path: Path
) -> None:
    case = {
        "url": server.url,
        "items": [{"prompt": rubrics.QUERIES[0], "reply": r, "rubric": RUBRIC} for r in REPLIES],
    }
    got = run_driver(DRIVER, case, tmp_path, verifiers_path)
    groups = [list(range(len(REPLIES)))]
    want = _server_answer(server, REPLIES, groups=groups)["components"]["rubric"]
    group = got["group"]
    assert group["values"] == pytest.approx(want, abs=ATOL)
    for trace, value in zip(group["traces"], want, strict=True):
        assert trace["rewards"]["rubric"] == [pytest.approx(value, abs=ATOL), 1.0]
    masked = got["group_masked"]
    assert masked["values"] == [None, None]
    for trace in masked["traces"]:
        assert "strict" not in trace["rewards"]
        assert any("parse_failure" in e for e in trace["errors"]), trace
