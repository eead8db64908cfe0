"""TRL's GRPOTrainer, OpenRLHF-style requests and the reward clients against a live server."""

from __future__ import annotations

import asyncio
import json
import math
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from datasets import Dataset
from helpers.training import ScoreCapture, grpo_config, grpo_trainer
from server_proc import ServerProcess
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

import tiny_models
from reward_client import AsyncRewardClient, RetryPolicy, RewardClient, RewardServerError
from reward_client.integrations.trl import RemoteReward

if TYPE_CHECKING:
    from trl import GRPOTrainer

#: A ChatML-like template for the policy; its markup must never reach the reward server.
POLICY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
REWARD_KEY = "rewards/remote_reward/mean"


# bert_server (the tiny BERT reward model: WordPiece, no chat template) and llama_server
# (the tiny Llama reward model, its own chat template): tests/conftest.py's shared servers.


def policy_tokenizer(path: Path, *, chat: bool) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat:
        tokenizer.chat_template = POLICY_CHAT_TEMPLATE
    return tokenizer


def train_grpo(
    policy: Path, url: str, prompts: list[Any], output_dir: Path, *, chat: bool
) -> tuple[GRPOTrainer, ScoreCapture]:
    """Two GRPO steps of 2 prompts x 2 generations, rewarded by RemoteReward(url)."""
    capture = ScoreCapture()
    reward = RemoteReward(url, http_client=capture.client())
    config = grpo_config(output_dir)
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(policy),
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=policy_tokenizer(policy, chat=chat),
    )
    trainer.train()
    return trainer, capture


def check_logged_rewards(trainer: GRPOTrainer, capture: ScoreCapture) -> None:
    """Each step's logged reward mean is the mean of what the server answered that step."""
    steps = [h for h in trainer.state.log_history if REWARD_KEY in h]
    assert [h["step"] for h in steps] == [1, 2]
    # One generation batch (4 completions, one request) per optimisation step.
    assert len(capture.exchanges) == 2
    for logged, (_body, answer) in zip(steps, capture.exchanges, strict=True):
        assert len(answer["scores"]) == 4
        assert logged[REWARD_KEY] == pytest.approx(sum(answer["scores"]) / 4, rel=1e-5, abs=1e-6)
        assert logged["rewards/remote_reward/truncated_frac"] == 0.0
    # TRL keeps the last batch's completions with the reward of each.
    last_answer = capture.exchanges[-1][1]
    logged_rewards = list(trainer._logs["rewards"]["remote_reward"])
    assert logged_rewards == pytest.approx(last_answer["scores"], rel=1e-5, abs=1e-6)
    assert all(math.isfinite(r) for r in logged_rewards)


def test_grpo_plain_prompts_rewards_equal_server_scores(
    gpt2_policy: Path, bert_server: ServerProcess, tmp_path: Path
) -> None:
    prompts = tiny_models.make_corpus(8, seed=1, min_words=2, max_words=5)
    trainer, capture = train_grpo(gpt2_policy, bert_server.url, prompts, tmp_path, chat=False)
    check_logged_rewards(trainer, capture)

    # The server received the prompt and completion texts as query/response pairs.
    last_prompts = list(trainer._logs["prompt"])
    last_completions = list(trainer._logs["completion"])
    # Each prompt's two completions go as a group (RemoteReward's groups, on by default).
    assert capture.exchanges[-1][0] == {
        "queries": last_prompts,
        "responses": last_completions,
        "groups": [[0, 1], [2, 3]],
    }
    # Scoring those completions afresh gives the rewards TRL logged.
    with RewardClient(bert_server.url) as client:
        rescored = client(last_prompts, last_completions)
    assert list(trainer._logs["rewards"]["remote_reward"]) == pytest.approx(rescored, abs=1e-5)


def test_grpo_conversational_prompts_are_sent_as_conversations(
    gpt2_policy: Path, llama_server: ServerProcess, tmp_path: Path
) -> None:
    texts = tiny_models.make_corpus(8, seed=2, min_words=2, max_words=5)
    prompts = [[{"role": "user", "content": t}] for t in texts]
    trainer, capture = train_grpo(gpt2_policy, llama_server.url, prompts, tmp_path, chat=True)
    check_logged_rewards(trainer, capture)

    for body, _ in capture.exchanges:
        assert list(body) == ["conversations", "groups"]
        assert body["groups"] == [[0, 1], [2, 3]]
        for conversation in body["conversations"]:
            assert [m["role"] for m in conversation] == ["user", "assistant"]
            assert conversation[0]["content"] in texts
            # The policy's template markup never reaches the reward model.
            assert "<|im_start|>" not in json.dumps(conversation)
    last = capture.exchanges[-1][0]["conversations"]
    expected = [
        list(p) + list(c)
        for p, c in zip(trainer._logs["prompt"], trainer._logs["completion"], strict=True)
    ]
    assert last == expected
    with RewardClient(llama_server.url) as client:
        rescored = client.score(conversations=expected)
    assert list(trainer._logs["rewards"]["remote_reward"]) == pytest.approx(rescored, abs=1e-5)


def test_openrlhf_concurrent_single_sample_requests(bert_server: ServerProcess) -> None:
    texts = tiny_models.make_corpus(16, seed=3, min_words=1, max_words=30)
    assert len(set(texts)) == 16
    with RewardClient(bert_server.url) as client:
        expected = client.score(texts=texts)

    async def post_all() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=bert_server.url, timeout=60) as http:
            responses = await asyncio.gather(
                *(
                    http.post(
                        "/get_reward",
                        json={"query": [text], "prompts": [text[:5]], "labels": ["x"]},
                    )
                    for text in texts
                )
            )
        assert [r.status_code for r in responses] == [200] * 16
        return [r.json() for r in responses]

    answers = asyncio.run(post_all())
    for answer, score in zip(answers, expected, strict=True):
        assert answer["rewards"] == pytest.approx([score], abs=1e-5)
        assert answer["scores"] == answer["rewards"]
        assert isinstance(answer["extra_logs"], dict)


def test_grpo_example_runs_offline(
    gpt2_policy: Path, bert_server: ServerProcess, tmp_path: Path
) -> None:
    data = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": p}) for p in tiny_models.make_corpus(6, seed=4, max_words=5)]
    data.write_text("\n".join(lines) + "\n")
    from examples import grpo_remote_reward  # here, not at collection: trl imports vLLM

    history = grpo_remote_reward.main(
        [
            "--reward-url",
            bert_server.url,
            "--model",
            str(gpt2_policy),
            "--dataset",
            str(data),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "2",
            "--per-device-train-batch-size",
            "4",
            "--num-generations",
            "2",
            "--max-completion-length",
            "8",
            "--use-cpu",
        ]
    )
    rewards = [h[REWARD_KEY] for h in history if REWARD_KEY in h]
    assert len(rewards) == 2 and all(math.isfinite(r) for r in rewards)
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_reward_clients_against_live_server(bert_server: ServerProcess) -> None:
    texts = tiny_models.make_corpus(10, seed=5)
    with RewardClient(bert_server.url) as client:
        reference = client.score_detailed(texts=texts)
        assert client.max_client_batch == client.info()["max_client_batch"]
        # BERT has no chat template: a conversation is a 422, reported at once.
        with pytest.raises(RewardServerError) as info:
            client.score(conversations=[[{"role": "user", "content": "hi"}]])
        assert info.value.status == 422 and info.value.attempts == 1
        assert info.value.message in str(info.value)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once closed

    # Chunks of 3 spread over a dead URL and the live one: same scores, same order.
    fast = RetryPolicy(backoff_max=0.01)
    with RewardClient([dead, bert_server.url], max_client_batch=3, retry=fast) as client:
        assert client.score(texts=texts) == pytest.approx(reference.scores, abs=1e-5)

    async def score_async() -> list[float]:
        async with AsyncRewardClient(
            [bert_server.url, dead], max_client_batch=4, retry=fast
        ) as client:
            return await client.score(texts=texts)

    assert asyncio.run(score_async()) == pytest.approx(reference.scores, abs=1e-5)
