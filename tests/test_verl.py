"""ppo_client.verl against a real reward server: scores equal the server's own /score.

The functions are called the way verl 0.9.1 calls a ``custom_reward_function`` (keyword
arguments, ``reward_kwargs`` merged in, extra infos as numpy object arrays). verl itself
needs Ray and tensordict to import, so the tests that run verl's own reward managers are
skipped unless ``import verl`` works (``pip install --no-deps verl==0.9.1`` plus ray,
tensordict<=0.10, omegaconf, codetiming and orjson).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_proc import ServerProcess, running_server

from ppo_client import verl as adapter
from ppo_client.client import RewardServerError

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
def server(llama_rm: Path) -> Iterator[ServerProcess]:
    """A real reward server with a tiny chat-template model."""
    with running_server(llama_rm) as srv:
        yield srv


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


def _call_with_kwargs(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """verl 0.9.1's wrapper around a custom reward function (trainer/ppo/reward.py)."""
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


async def _call_with_kwargs_async(
    raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any
) -> Any:
    """verl 0.9.1's wrapper around an async custom reward function."""
    return await raw_fn(*args, **{**kwargs, **extra_kwargs})


def test_verl_call_shape(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """verl picks await or thread pool by inspect.iscoroutinefunction on its partial."""
    monkeypatch.setenv("REWARD_URL", server.url)
    reward_kwargs = {"prompt_key": "prompt"}
    sync_fn = functools.partial(_call_with_kwargs, adapter.compute_score, reward_kwargs)
    async_fn = functools.partial(
        _call_with_kwargs_async, adapter.compute_score_async, reward_kwargs
    )
    assert not inspect.iscoroutinefunction(sync_fn)
    assert inspect.iscoroutinefunction(async_fn)
    # With its own reward model enabled, verl's reward loop adds these two keyword arguments.
    call = {
        "data_source": "hh",
        "solution_str": RESPONSES[2],
        "ground_truth": "x",
        "extra_info": {"prompt": MESSAGES, "num_turns": None, "rollout_reward_scores": {}},
        "reward_router_address": "127.0.0.1:1",
        "reward_model_tokenizer": None,
    }
    with caplog.at_level(logging.WARNING, logger="ppo_client.verl"):
        sync_score = sync_fn(**call)

        async def run() -> Any:
            try:
                return await async_fn(**call)
            finally:
                await adapter.aclose_clients()

        async_score = asyncio.run(run())
    assert caplog.records == []
    expected = server_score(server.url, expected_body(call["extra_info"], RESPONSES[2]))
    assert sync_score == pytest.approx(expected["scores"][0], abs=1e-5)
    assert async_score == pytest.approx(sync_score, abs=1e-5)


# --- verl's own reward managers (skipped unless verl imports) -------------------------------


@pytest.fixture(scope="module")
def verl_batch(gpt2_policy: Path) -> tuple[Any, Any, list[dict[str, Any]], list[str]]:
    """A verl DataProto of four samples as the rollout leaves it, and the policy tokenizer."""
    pytest.importorskip(
        "verl", exc_type=ImportError, reason="verl 0.9.1 and its deps not installed"
    )
    from transformers import AutoTokenizer
    from verl import DataProto

    tokenizer = AutoTokenizer.from_pretrained(gpt2_policy)
    pad = tokenizer.eos_token_id
    extra_infos = [dict(EXTRA_INFOS[i]) for i in (0, 2, 3, 1)]
    prompt_ids = [tokenizer.encode("the movie"), tokenizer.encode("a story was")] * 2
    response_ids = [tokenizer.encode(r) for r in RESPONSES]
    p_len, r_len = max(map(len, prompt_ids)), max(map(len, response_ids)) + 2
    prompts = torch_tensor([[pad] * (p_len - len(p)) + p for p in prompt_ids])  # left-padded
    responses = torch_tensor([r + [pad] * (r_len - len(r)) for r in response_ids])
    mask = torch_tensor(
        [
            [0] * (p_len - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_len - len(r))
            for p, r in zip(prompt_ids, response_ids, strict=True)
        ]
    )
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={
            "data_source": np.array(["hh"] * 4, dtype=object),
            "reward_model": np.array([{"ground_truth": "x"}] * 4, dtype=object),
            "extra_info": np.array(extra_infos, dtype=object),
        },
    )
    decoded = [tokenizer.decode(r, skip_special_tokens=True) for r in response_ids]
    assert decoded == RESPONSES
    return data, tokenizer, extra_infos, [len(r) for r in response_ids]


def torch_tensor(rows: list[list[int]]) -> Any:
    import torch

    return torch.tensor(rows, dtype=torch.long)


@pytest.fixture
def verl_case(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, verl_batch: Any
) -> tuple[Any, Any, list[int], list[float]]:
    """The verl batch, its tokenizer, response lengths and the server's scores of each sample."""
    monkeypatch.setenv("REWARD_URL", server.url)
    data, tokenizer, extra_infos, lengths = verl_batch
    expected = [
        server_score(server.url, expected_body(info, r))["scores"][0]
        for info, r in zip(extra_infos, RESPONSES, strict=True)
    ]
    return data, tokenizer, lengths, expected


def test_verl_legacy_naive_and_batch_managers(verl_case: Any) -> None:
    from verl.workers.reward_manager import BatchRewardManager, NaiveRewardManager

    data, tokenizer, lengths, expected = verl_case
    naive = NaiveRewardManager(tokenizer, num_examine=0, compute_score=adapter.compute_score)
    batch = BatchRewardManager(
        tokenizer, num_examine=0, compute_score=adapter.compute_score_batch, prompt_key="prompt"
    )
    for manager in (naive, batch):
        rewards = manager(data)
        # The score sits on each response's last valid token.
        got = [float(rewards[i, n - 1]) for i, n in enumerate(lengths)]
        assert got == pytest.approx(expected, abs=1e-5)
        assert float(rewards.abs().sum()) == pytest.approx(sum(abs(s) for s in expected), abs=1e-4)


def test_verl_reward_loop_naive_manager(verl_case: Any) -> None:
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
    from verl.trainer.ppo.reward import get_custom_reward_fn

    data, tokenizer, _, expected = verl_case
    for name in ("compute_score_async", "compute_score"):
        config = OmegaConf.create(
            {
                "reward": {
                    "custom_reward_function": {
                        "path": "pkg://ppo_client.verl",
                        "name": name,
                        "reward_kwargs": {"prompt_key": "prompt"},
                    }
                }
            }
        )
        fn = get_custom_reward_fn(config)

        async def run(config: Any = config, fn: Any = fn) -> list[Any]:
            # verl's RewardLoopWorker: one manager, one run_single task per sample.
            manager = get_reward_manager_cls("naive")(config, tokenizer, fn)
            try:
                return await asyncio.gather(
                    *(manager.run_single(data[i : i + 1]) for i in range(4))
                )
            finally:
                await adapter.aclose_clients()

        outputs = asyncio.run(run())
        assert [o["reward_score"] for o in outputs] == pytest.approx(expected, abs=1e-5)
