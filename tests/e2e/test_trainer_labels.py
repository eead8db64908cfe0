"""``label_column``: each rollout's reward call carries its prompt's label, in order, to a
reward callable and through the RewardClient to the server; a missing column or a reward
that takes no labels stops the run before it starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import httpx
import pytest
from helpers.training import PROMPTS, ppo_config

from ppo_client import PPOTrainer
from ppo_client.config import ConfigError, PPOConfig, parse_overrides
from reward_client import RewardClient

#: Tiny models run fastest on one thread, especially on a shared machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def labelled_rows() -> list[dict[str, Any]]:
    """Each prompt's label is the prompt itself, so that pairing can be checked."""
    return [{"prompt": p, "answer": {"text": p, "row": i}} for i, p in enumerate(PROMPTS)]


def test_a_reward_callable_gets_each_prompts_label(gpt2_policy: Path, tmp_path: Path) -> None:
    calls: list[tuple[list[Any], list[Any]]] = []

    def reward(prompts: list[Any], responses: list[str], labels: list[Any]) -> list[float]:
        calls.append((list(prompts), list(labels)))
        return [0.0] * len(responses)

    cfg = ppo_config(
        gpt2_policy,
        tmp_path / "run",
        total_episodes=16,
        label_column="answer",
        num_sample_generations=2,
        num_samples_to_log=8,
    )
    PPOTrainer(cfg, train_dataset=labelled_rows(), reward_fn=reward).train()
    assert [len(prompts) for prompts, _ in calls] == [8, 8]
    for prompts, labels in calls:
        assert [label["text"] for label in labels] == prompts  # each with its own prompt
    rows = [label["row"] for _, labels in calls for label in labels]
    assert len(set(rows)) == 16  # one draw without replacement per pass over the data
    # samples.jsonl shows each logged rollout with its own label.
    lines = (tmp_path / "run" / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    samples = [json.loads(line) for line in lines]
    assert len(samples) == 16
    assert all(s["label"]["text"] == s["prompt"] for s in samples), samples


def test_the_client_sends_the_labels_with_the_items(gpt2_policy: Path, tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json={"model": "rm", "max_client_batch": 3})
        body = json.loads(request.content)
        bodies.append(body)
        n = len(body["queries"])
        return httpx.Response(
            200, json={"scores": [0.5] * n, "tokens": [4] * n, "truncated": [False] * n}
        )

    client = RewardClient(
        "http://rm.test", http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    rows = [{"prompt": p, "answer": p.upper()} for p in PROMPTS]
    dataset = datasets.Dataset.from_list(rows)
    cfg = ppo_config(gpt2_policy, tmp_path / "run", total_episodes=8, label_column="answer")
    PPOTrainer(cfg, train_dataset=dataset, reward_fn=client).train()
    assert [len(b["queries"]) for b in bodies] == [3, 3, 2]  # chunked with their items
    queries = [q for b in bodies for q in b["queries"]]
    assert [x for b in bodies for x in b["labels"]] == [q.upper() for q in queries]


@pytest.mark.parametrize("kind", ["list", "datasets"])
def test_a_missing_label_column_is_a_config_error(
    gpt2_policy: Path, tmp_path: Path, kind: str
) -> None:
    rows: list[dict[str, Any]] = [{"prompt": p, "answer": "x"} for p in PROMPTS]
    rows[5] = {"prompt": PROMPTS[5]}
    data: Any = rows if kind == "list" else datasets.Dataset.from_list(rows[:5])
    cfg = ppo_config(gpt2_policy, tmp_path / "run", label_column="solution")
    with pytest.raises(ConfigError, match="'solution' column") as raised:
        PPOTrainer(cfg, train_dataset=data, reward_fn=lambda p, r, labels: [0.0] * len(r))
    assert "label_column" in str(raised.value)
    if kind == "list":
        cfg = ppo_config(gpt2_policy, tmp_path / "run", label_column="answer")
        with pytest.raises(ConfigError, match=r"row 5 .*'answer' column"):
            PPOTrainer(cfg, train_dataset=rows, reward_fn=lambda p, r, labels: [0.0] * len(r))


def test_a_reward_without_labels_is_refused_at_start(gpt2_policy: Path, tmp_path: Path) -> None:
    cfg = ppo_config(gpt2_policy, tmp_path / "run", label_column="answer")
    with pytest.raises(ConfigError, match="takes no labels= keyword"):
        PPOTrainer(cfg, train_dataset=labelled_rows(), reward_fn=lambda p, r: [0.0] * len(r))


def test_label_column_is_a_flag_and_a_yaml_key(tmp_path: Path) -> None:
    assert PPOConfig().label_column is None
    for flag in ("--label_column", "--label-column"):
        assert parse_overrides([flag, "answer"]) == {"label_column": "answer"}
    path = tmp_path / "run.yaml"
    path.write_text("label_column: solution\n", encoding="utf-8")
    assert PPOConfig.from_sources(path).label_column == "solution"
    flags = parse_overrides(["--label-column", "answer"])
    assert PPOConfig.from_sources(path, flags).label_column == "answer"
