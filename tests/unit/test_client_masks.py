"""Masked items through the reward client and its framework adapters, against mock transports.

The server masks an item whose reward could not be computed: ``null`` in ``scores`` with
its reason in ``masked`` (``/score``), a fill value with ``extra_logs["masked"]``
(``/get_reward``) or with the ``X-Reward-Masked`` header (vLLM- and TEI-shaped routes). The
client gives None for it in every protocol; TRL's RemoteReward hands TRL the None; the verl
and OpenRLHF adapters give the fill value and log one warning per call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import reward_client.integrations.openrlhf as openrlhf
from reward_client import AsyncRewardClient, RewardClient, RewardServerError, ScoreResult
from reward_client.integrations import verl
from reward_client.integrations.masks import masked_score
from reward_client.integrations.trl import RemoteReward
from reward_client.results import merge

URL = "http://rm.test"

#: Per item text: its score, or the reason it is masked.
OUTCOMES: dict[str, float | str] = {
    "good": 1.5,
    "bad": -0.5,
    "hangs": "timeout",
    "raises": "crash",
    "fine": 0.25,
    "nonsense": "parse_failure",
}


def masked_answer(texts: list[str], *, with_reasons: bool = True) -> dict[str, Any]:
    """A /score answer for ``texts``: masked ones null, with ``masked`` when some are."""
    outcomes = [OUTCOMES.get(t, 0.0) for t in texts]
    answer: dict[str, Any] = {
        "scores": [o if isinstance(o, float) else None for o in outcomes],
        "tokens": [len(t) for t in texts],
        "truncated": [False] * len(texts),
    }
    if with_reasons and any(isinstance(o, str) for o in outcomes):
        answer["masked"] = [o if isinstance(o, str) else None for o in outcomes]
    return answer


def item_texts(body: dict[str, Any]) -> list[str]:
    """The item keys of a /score body: texts, or responses of pairs and conversations."""
    if "texts" in body:
        return list(body["texts"])
    if "responses" in body:
        return list(body["responses"])
    return [c[-1]["content"] for c in body["conversations"]]


class Masking:
    """Mock transport handler: /score answers with masks; records the bodies."""

    def __init__(self, **answer: Any) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json={"max_client_batch": 2})
        body = json.loads(request.content)
        self.bodies.append(body)
        return httpx.Response(200, json=masked_answer(item_texts(body), **self.answer))


TEXTS = ["good", "hangs", "bad", "raises", "fine", "nonsense"]
EXPECTED = [1.5, None, -0.5, None, 0.25, None]
REASONS = [None, "timeout", None, "crash", None, "parse_failure"]


def sync_client(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> RewardClient:
    return RewardClient(URL, http_client=httpx.Client(transport=httpx.MockTransport(handler)), **kw)


# --- the client ---------------------------------------------------------------------------


def test_masked_items_are_none_with_their_reasons_across_chunks() -> None:
    handler = Masking()
    with sync_client(handler) as client:
        assert client.score(texts=TEXTS) == EXPECTED
        result = client.score_detailed(texts=TEXTS)
    # Three chunks of two; the first has no mask (no "masked" field), the others do.
    assert [item_texts(b) for b in handler.bodies[:3]] == [TEXTS[:2], TEXTS[2:4], TEXTS[4:]]
    assert result.scores == EXPECTED
    assert result.masked == REASONS
    assert result.masked_count == 3
    assert result.masked_reasons() == {"timeout": 1, "crash": 1, "parse_failure": 1}
    assert result.tokens == [len(t) for t in TEXTS]


def test_async_client_and_reward_callable_give_none_too() -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(Masking()))
    client = AsyncRewardClient(URL, http_client=http)
    prompts = ["p"] * len(TEXTS)
    assert asyncio.run(client(prompts, TEXTS)) == EXPECTED
    with sync_client(Masking()) as blocking:
        assert blocking(prompts, TEXTS) == EXPECTED


def test_no_masked_item_means_no_reasons() -> None:
    with sync_client(Masking()) as client:
        result = client.score_detailed(texts=["good", "bad", "fine"])
    assert result.scores == [1.5, -0.5, 0.25]
    assert result.masked is None and result.masked_count == 0 and result.masked_reasons() == {}


def test_a_null_score_without_a_reason_is_masked_unknown() -> None:
    with sync_client(Masking(with_reasons=False)) as client:
        result = client.score_detailed(texts=["hangs", "good"])
    assert result.scores == [None, 1.5]
    assert result.masked == ["unknown", None]


def test_merge_of_chunks_with_and_without_masks() -> None:
    plain = ScoreResult([1.0], [1], [False], components={"a": [1.0]})
    masked = ScoreResult(
        [None, 2.0],
        [1, 1],
        [False, False],
        components={"a": [None, 2.0]},
        masked=["deadline", None],
    )
    merged = merge([plain, masked, plain])
    assert merged.scores == [1.0, None, 2.0, 1.0]
    assert merged.masked == [None, "deadline", None, None]
    assert merged.components == {"a": [1.0, None, 2.0, 1.0]}
    assert merge([plain, plain]).masked is None


def answering(payload: Any) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json={"max_client_batch": 8})
        return httpx.Response(200, json=payload)

    return handler


def test_components_and_outcome_scores_may_be_null() -> None:
    payload = {
        "scores": [None, 0.5],
        "tokens": [3, 4],
        "truncated": [False, False],
        "masked": ["remote_error", None],
        "components": {"rm": [0.1, 0.2], "judge": [None, 0.8]},
        "outcome_scores": [None, 0.3],
    }
    with sync_client(answering(payload)) as client:
        result = client.score_detailed(texts=["a", "b"], components=True)
    assert result.components == {"rm": [0.1, 0.2], "judge": [None, 0.8]}
    assert result.outcome_scores == [None, 0.3]
    assert result.masked == ["remote_error", None]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"masked": ["timeout"]}, "masked is not a list of 2 reasons"),
        ({"masked": [3, None]}, r"masked\[0\] is 3, not a reason or null"),
        ({"masked": ["timeout", "crash"]}, "item 1 has a score and a mask reason"),
        ({"components": {"j": [None, "x"]}}, r"not a finite number or null"),
        ({"objectives": {"o": [None, 1.0]}}, r"objectives\['o'\]\[0\] is None, not a finite"),
    ],
)
def test_malformed_masks_are_errors(changes: dict[str, Any], message: str) -> None:
    payload = {"scores": [None, 0.5], "tokens": [3, 4], "truncated": [False, False], **changes}
    with (
        sync_client(answering(payload), retry_timeout=0) as client,
        pytest.raises(RewardServerError, match="invalid response") as info,
    ):
        client.score_detailed(texts=["a", "b"])
    assert re.search(message, str(info.value)), str(info.value)


@pytest.mark.parametrize("protocol", ["vllm", "tei"])
def test_vllm_and_tei_routes_mask_through_their_header(protocol: str) -> None:
    """The server's vLLM- and TEI-shaped routes fill masked items with 0.0 and list them in
    X-Reward-Masked: the client gives None there, and takes answers without it as they are."""
    headers: dict[str, str] = {"X-Reward-Masked": "1,2"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(404)
        body = json.loads(request.content)
        if protocol == "vllm":
            texts = body["input"]
            data = [{"index": i, "probs": [0.0 if i else 0.7]} for i in range(len(texts))]
            return httpx.Response(200, json={"data": data}, headers=headers)
        texts = body["inputs"]
        answer = [[{"score": 0.0 if i else 0.7, "label": "L"}] for i in range(len(texts))]
        return httpx.Response(200, json=answer, headers=headers)

    with sync_client(handler, protocol=protocol, max_client_batch=4) as client:
        result = client.score_detailed(texts=["a", "b", "c"])
        assert result.scores == [0.7, None, None]
        assert result.masked == [None, "unknown", "unknown"]
        headers.clear()
        assert client.score(texts=["a", "b", "c"]) == [0.7, 0.0, 0.0]
        headers["X-Reward-Masked"] = "5"
        with pytest.raises(RewardServerError, match="X-Reward-Masked names item 5 of 3"):
            client.score(texts=["a", "b", "c"])


def test_openrlhf_protocol_reads_extra_logs_masked() -> None:
    payload = {"rewards": [0.5, 0.0], "scores": [0.5, 0.0], "extra_logs": {"masked": [0.0, 1.0]}}
    with sync_client(answering(payload), protocol="openrlhf", max_client_batch=8) as client:
        result = client.score_detailed(texts=["a", "b"])
    assert result.scores == [0.5, None] and result.masked == [None, "unknown"]


# --- TRL -----------------------------------------------------------------------------------


def test_trl_remote_reward_returns_none_for_masked_items(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = Masking()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    # groups=False: six completions of one prompt would be cut to fit a request, with a
    # warning of their own (tests/unit/test_trl_remote_reward.py).
    reward = RemoteReward(URL, http_client=http, max_client_batch=4, name="rm", groups=False)
    logged: dict[str, float] = {}
    with caplog.at_level(logging.WARNING, logger="reward_client.integrations.trl"):
        scores = asyncio.run(
            reward(
                prompts=["p"] * len(TEXTS),
                completions=TEXTS,
                log_metric=lambda name, value: logged.__setitem__(name, value),
            )
        )
    assert scores == EXPECTED
    assert logged["rewards/rm/masked_frac"] == 0.5
    assert caplog.messages == [
        "rm: the reward server masked 3 of 6 item(s) (crash 1, parse_failure 1, timeout 1): "
        "None for TRL, which leaves them out of their group's baseline"
    ]


def test_trl_components_return_none_where_a_component_is_masked() -> None:
    payload = {
        "scores": [None, 0.5],
        "tokens": [3, 4],
        "truncated": [False, False],
        "masked": ["remote_error", None],
        "components": {"rm": [0.1, 0.2], "judge": [None, 0.8]},
    }
    http = httpx.AsyncClient(transport=httpx.MockTransport(answering(payload)))
    reward = RemoteReward(URL, http_client=http, max_client_batch=4)
    rm, judge = reward.components(["rm", "judge"])

    async def both() -> list[list[float | None]]:
        kwargs: dict[str, Any] = {"prompts": ["p", "q"], "completions": ["a", "b"]}
        return list(await asyncio.gather(rm(**kwargs), judge(**kwargs)))

    assert asyncio.run(both()) == [[0.1, 0.2], [None, 0.8]]


# --- verl and OpenRLHF: a fill value ---------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_adapters(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No settings from the environment; no client kept across tests."""
    for name in ("REWARD_URL", "REWARD_MASKED_SCORE", "REWARD_DEADLINE", "REWARD_DETAILS"):
        monkeypatch.delenv(name, raising=False)
    yield
    verl.close_clients()
    openrlhf.close_clients()


def options(handler: Any, **more: Any) -> dict[str, Any]:
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return {"http_client": http, "max_client_batch": 4, **more}


def test_verl_gives_masked_items_the_fill_value_and_warns_once_per_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kwargs: dict[str, Any] = {"reward_url": URL, "reward_client_options": options(Masking())}
    n = len(TEXTS)
    with caplog.at_level(logging.WARNING, logger="reward_client.integrations.verl"):
        scores = verl.compute_score_batch(["d"] * n, TEXTS, [None] * n, None, **kwargs)
    assert scores == [1.5, 0.0, -0.5, 0.0, 0.25, 0.0]
    assert [m for m in caplog.messages if "masked" in m] == [
        "reward_client.integrations.verl: the reward server masked 3 of 6 item(s) "
        "(crash 1, parse_failure 1, timeout 1): they score 0 for verl"
    ]
    # A fill value of one's own, and the details say which items were masked.
    details = verl.compute_score_batch(
        ["d"] * n, TEXTS, [None] * n, None, masked_score=-1, reward_details=True, **kwargs
    )
    assert [d["score"] for d in details] == [1.5, -1.0, -0.5, -1.0, 0.25, -1.0]  # type: ignore[index]
    assert [d["masked"] for d in details] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]  # type: ignore[index]
    assert verl.compute_score("d", "hangs", None, None, **kwargs) == 0.0

    async def one() -> Any:
        http = httpx.AsyncClient(transport=httpx.MockTransport(Masking()))
        opts = {"http_client": http, "max_client_batch": 4}
        return await verl.compute_score_async(
            "d", "raises", None, None, reward_url=URL, reward_client_options=opts
        )

    assert asyncio.run(one()) == 0.0


def test_openrlhf_gives_masked_items_the_fill_value_and_flags_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("REWARD_MASKED_SCORE", "-2")
    with caplog.at_level(logging.WARNING, logger="reward_client.integrations.openrlhf"):
        out = openrlhf.reward_func(
            TEXTS,
            TEXTS,
            [None] * len(TEXTS),
            reward_url=URL,
            reward_client_options=options(Masking()),
        )
    assert out["rewards"].tolist() == [1.5, -2.0, -0.5, -2.0, 0.25, -2.0]
    assert out["scores"].tolist() == out["rewards"].tolist()
    assert out["extra_logs"]["reward_masked"].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert caplog.messages == [
        "reward_client.integrations.openrlhf: the reward server masked 3 of 6 item(s) "
        "(crash 1, parse_failure 1, timeout 1): they score -2 for OpenRLHF"
    ]


def test_masked_score_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert masked_score({}) == 0.0
    assert masked_score({"masked_score": "0.5"}) == 0.5
    monkeypatch.setenv("REWARD_MASKED_SCORE", "-1")
    assert masked_score({}) == -1.0
    assert masked_score({"masked_score": 0}) == 0.0  # the keyword argument first, even 0
    for bad in ("nan", "inf", "x", [1]):
        with pytest.raises(ValueError, match="masked_score"):
            masked_score({"masked_score": bad})
