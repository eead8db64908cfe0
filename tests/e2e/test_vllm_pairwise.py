"""Pairwise judges on the vLLM engine (issue 36 item 2): ``kind: judge``, ``mode: pairwise``
served by a real ``reward-server --engine vllm``, against the independent computation of
``tests/integration/test_pairwise_judge.py`` (plain transformers, one unbatched forward per
ordered pair, the aggregation written again, Bradley-Terry by scipy) within 1e-5.

Two entries, each its own vLLM engine on the same tiny Llama-style judge with 64-wide heads
(vLLM's CPU kernels need them): ``pairs: all`` with ``win_rate`` and ``pairs: 2`` with
``bradley_terry``; one request holds groups of 2, 4 and 8 and an ungrouped item (masked
``no_opponent``). A group of 8 with a long shared question reads its shared prefix from
vLLM's prefix cache (``reward_server_model_cached_tokens_total``).

Without vLLM these tests skip, unless ``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``)
makes the absence a failure.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.judges import save_judge
from helpers.models_files import write_models
from helpers.pairwise import assert_close, entry, expected, first_better, group_request
from helpers.vllm import ipc_folder, require_vllm, vllm_server
from server_proc import ServerProcess, metric

require_vllm()

SETUPS = {"win": ("all", "win_rate"), "bt2": (2, "bradley_terry")}


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_judge(tmp_path_factory.mktemp("vllm_pairwise"), "llama", wide=True)


@pytest.fixture(scope="module")
def server(judge: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    entries = [
        entry(judge, name, pairs=pairs, pairwise_aggregate=how, weight=float(name == "win"))
        for name, (pairs, how) in SETUPS.items()
    ]
    path = write_models(tmp_path_factory.mktemp("vllm_pairwise_models"), entries)
    with vllm_server(None, "--models", str(path)) as proc:
        sockets = ipc_folder(proc)
        yield proc
    # Stopped, the server left no socket file of vLLM's behind (vLLM removes none itself).
    assert not sockets.exists(), sorted(sockets.iterdir())


def test_vllm_s_sockets_are_in_a_folder_of_the_server_s_own(server: ServerProcess) -> None:
    sockets = ipc_folder(server)
    assert sockets.parent == Path(tempfile.gettempdir()), sockets
    assert sockets.name.startswith("reward-server-vllm-"), sockets
    assert any(entry.is_socket() for entry in sockets.iterdir()), sorted(sockets.iterdir())


def score(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/score", json={**body, "components": True}, timeout=300)
    assert r.status_code == 200, f"{r.text}\n{server.log()[-4000:]}"
    return dict(r.json())


def test_pairwise_scores_equal_an_independent_computation(
    server: ServerProcess, judge: Path
) -> None:
    body = group_request()
    answer = score(server, body)
    p = first_better(judge, body)
    assert max(p.values()) - min(p.values()) > 0.02, p
    for name, (pairs, how) in SETUPS.items():
        assert_close(answer["components"][name], expected(p, body, pairs, how))
    assert answer["masked"][-1] == "no_opponent" and answer["scores"][-1] is None


def test_a_group_shares_its_prompt_through_the_prefix_cache(
    server: ServerProcess, judge: Path
) -> None:
    """About 270 tokens of the question: two of vLLM's 128-token CPU blocks that the group's
    56 rows (under pairs: all) share."""
    body = group_request((8,), alone=False)
    body["queries"] = ["Explain slowly why the sky looks blue on a clear day, in detail. " * 5] * 8
    before = metric(server.url, "reward_server_model_cached_tokens_total", model="win")
    answer = score(server, body)
    cached = metric(server.url, "reward_server_model_cached_tokens_total", model="win") - before
    assert not any(answer["truncated"]), answer["tokens"]
    p = first_better(judge, body)
    assert_close(answer["components"]["win"], expected(p, body, "all", "win_rate"))
    # Rows admitted in vLLM's first step compute the shared blocks; most of the others read
    # them (on this CPU 77 of the 112 blocks that the 56 rows' two shared blocks could be).
    assert cached >= 28 * 2 * 128, (cached, sum(answer["tokens"]))


def test_info_lists_the_pairwise_judges_on_vllm(server: ServerProcess) -> None:
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    win, bt2 = info["models"]
    assert (
        win["mode"] == "pairwise"
        and win["pairs"] == "all"
        and win["pairwise_aggregate"] == "win_rate"
    )
    assert bt2["pairs"] == 2 and bt2["pairwise_aggregate"] == "bradley_terry"
    assert win["engine_settings"]["enable_prefix_caching"] is True
    # One judge, the same engine settings: one vLLM engine for both entries.
    assert win["engine_settings"] == bt2["engine_settings"]
    assert win["engine_entries"] == bt2["engine_entries"] == 2
