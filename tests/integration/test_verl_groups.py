"""verl's own ``batch`` reward manager (verl 0.9.1, in ``.venv/verl``) sends a GRPO batch's
groups through ``reward_client.integrations.verl`` to a real server whose models normalise
within groups, and the rewards it gets equal the server's own ``/score`` answer for the same
groups (issue 36, acceptance 3).

The batch is built as verl's trainer builds it (a uid per prompt, ``repeat(n,
interleave=True)``); verl 0.9.1's managers pass the reward function each sample's
``extra_info`` but not its uid, so the adapter groups by ``extra_info["index"]`` (the dataset
row, as verl's preprocessing writes it) and the prompt. verl runs in a subprocess
(``verl_groups_driver.py``), as in test_verl.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.drivers import run_driver
from helpers.models_files import length_verifier
from helpers.servers import serve
from server_proc import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "verl_groups_driver.py"
N = 3
CHAT = [{"role": "user", "content": "was the movie good"}]
PROMPTS: list[Any] = [CHAT, "name a colour"]
RESPONSES = [
    "the movie was great",
    "boring plot and bad dialogue",
    "i loved it",
    "red",
    "a deep shade of blue",
    "green, like grass",
]


@pytest.fixture(scope="module")
def server(llama_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real server: a reward model and a python verifier, each normalised in its group."""
    folder = tmp_path_factory.mktemp("verl_groups")
    models = [
        {"name": "rm", "model": str(llama_rm), "weight": 1.0, "normalize": "group"},
        length_verifier(weight=0.5, normalize="group"),
    ]
    with serve(models=models, folder=folder) as srv:
        yield srv


def run_verl(
    verl_path: str,
    server: ServerProcess,
    policy: Path,
    folder: Path,
    **reward_kwargs: Any,
) -> dict[str, Any]:
    case = {
        "url": server.url,
        "tokenizer": str(policy),
        "n": N,
        "prompts": PROMPTS,
        "responses": RESPONSES,
        "reward_kwargs": reward_kwargs,
    }
    result = run_driver(DRIVER, case, folder, verl_path)
    assert result["decoded"] == RESPONSES
    assert result["uids"] == [f"uid-{i // N}" for i in range(len(RESPONSES))]
    return result


def server_scores(url: str, body: dict[str, Any]) -> list[float]:
    response = httpx.post(f"{url}/score", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["scores"]


def test_verl_batch_manager_scores_equal_the_server_s_for_the_same_groups(
    verl_path: str,
    server: ServerProcess,
    gpt2_policy: Path,
    tmp_path: Path,
) -> None:
    result = run_verl(verl_path, server, gpt2_policy, tmp_path)
    chat = server_scores(
        server.url,
        {
            "conversations": [[*CHAT, {"role": "assistant", "content": r}] for r in RESPONSES[:N]],
            "labels": ["x"] * N,
            "groups": [list(range(N))],
        },
    )
    text = server_scores(
        server.url,
        {
            "queries": [PROMPTS[1]] * N,
            "responses": RESPONSES[N:],
            "labels": ["x"] * N,
            "groups": [list(range(N))],
        },
    )
    assert result["rewards"] == pytest.approx(chat + text, abs=1e-5)
    # Normalised within each group, every component's scores sum to 0 there.
    for group in (result["rewards"][:N], result["rewards"][N:]):
        assert sum(group) == pytest.approx(0.0, abs=1e-4)
        assert any(abs(s) > 1e-3 for s in group)


def test_without_groups_such_a_server_refuses_the_batch(
    verl_path: str,
    server: ServerProcess,
    gpt2_policy: Path,
    tmp_path: Path,
) -> None:
    with pytest.raises(AssertionError, match="send groups"):
        run_verl(verl_path, server, gpt2_policy, tmp_path, reward_groups=False)
