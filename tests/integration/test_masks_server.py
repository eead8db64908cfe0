"""Masked items and deadlines in a real server process (issue 35).

One server holds a learned reward model and entries that fail on purpose: a python verifier
(one behaviour per label: it raises, returns NaN or a string, exits, hangs), the same
function with ``on_error: 0.5``, a remote reward service that is down, and a generate judge
(an untrained causal LM) whose answers never hold a number. An item whose reward could not be
computed is ``null`` in ``scores`` with its reason in ``masked``; in the combined score only
models with a non-zero weight mask it; every masked item is counted by model and reason.

A code verifier whose sandbox breaks masks its items ``sandbox_error``. A second server
holds a python verifier that hangs on every item: a request of 64 items with a 10 s
deadline is answered in at most 11 s, every item masked ``deadline`` or ``timeout``,
``/health`` answering throughout, and the next request is served by fresh worker processes.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.models_files import python_verifier, verifier_function
from helpers.posting import score
from helpers.servers import serve
from server_proc import ServerProcess, free_port, metric

from reward_server.sandbox import find_bwrap

BY_LABEL = verifier_function("by_label")

#: Each label's behaviour in tests/verifier_functions.py:by_label, and the reason it gives.
LABELS = ["ok", "raise", "nan", "string", "exit", "sleep"]
REASONS = [None, "error", "non_finite", "bad_result", "crash", "timeout"]
RESPONSES = ["fine", "b", "c", "d", "e", "f"]


def python(name: str, **extra: Any) -> dict[str, Any]:
    return python_verifier(name, BY_LABEL, **extra)


@pytest.fixture(scope="module")
def server(
    gpt2_rm: Path, gpt2_policy: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("masks")
    models = [
        {"name": "rm", "model": str(gpt2_rm), "weight": 0.1},
        python("check", workers=2, timeout_s=1.5),
        python("filled", workers=2, timeout_s=1.5, on_error=0.5, weight=0.0),
        {
            "name": "down",
            "kind": "remote",
            "url": f"http://127.0.0.1:{free_port()}",  # nothing listens there
            "call_timeout_s": 1.0,
            "weight": 0.0,
        },
        {
            "name": "judge",
            "kind": "judge",
            "model": str(gpt2_policy),
            "mode": "generate",
            "template": "{{ response }}",
            "score_pattern": "Grade: (\\d+) of 100 exactly",
            "max_new_tokens": 4,
            "weight": 0.0,
        },
    ]
    with serve(models=models, folder=folder) as srv:
        yield srv


def test_each_failure_masks_its_item_with_its_reason(server: ServerProcess) -> None:
    before = {
        reason: metric(server.url, "reward_server_masked_items_total", model="check", reason=reason)
        for reason in REASONS[1:]
    }
    data = score(server, texts=RESPONSES, labels=LABELS, model="check")
    assert data["scores"][0] == float(len("fine"))
    assert data["scores"][1:] == [None] * 5
    assert data["masked"] == REASONS
    for reason in REASONS[1:]:
        after = metric(server.url, "reward_server_masked_items_total", model="check", reason=reason)
        assert after - before[reason] == 1.0, reason


def test_a_remote_that_is_down_and_a_judge_that_does_not_parse_mask(
    server: ServerProcess,
) -> None:
    down = score(server, texts=["x", "y"], model="down")
    assert down["scores"] == [None, None] and down["masked"] == ["remote_error"] * 2
    judge = score(server, texts=["x", "y"], model="judge")
    assert judge["scores"] == [None, None] and judge["masked"] == ["parse_failure"] * 2
    counted = metric(
        server.url, "reward_server_masked_items_total", model="judge", reason="parse_failure"
    )
    assert counted >= 2.0


def test_in_a_composite_only_a_weighted_component_masks_the_item(server: ServerProcess) -> None:
    data = score(server, texts=RESPONSES, labels=LABELS)
    components = data["components"]
    # The weighted verifier masks items 1-5; the weight-0 models mask theirs in components
    # only (every item of the remote that is down and of the judge), never the score.
    assert data["masked"] == REASONS
    assert data["scores"][1:] == [None] * 5
    rm = components["rm"][0]
    assert data["scores"][0] == pytest.approx(0.1 * rm + float(len("fine")))
    assert components["check"] == [4.0, None, None, None, None, None]
    # on_error as a number fills instead of masking.
    assert components["filled"] == [4.0, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert components["down"] == [None] * 6 and components["judge"] == [None] * 6
    assert data["verifier_errors"]["filled"] == REASONS
    assert data["verifier_errors"]["down"] == ["remote_error"] * 6


def test_a_composite_of_working_items_has_no_masked_field(server: ServerProcess) -> None:
    data = score(server, texts=["fine"], labels=["ok"], model="check")
    assert data["scores"] == [4.0] and "masked" not in data


def test_mask_is_the_default_on_error_of_verifiers_judges_and_remotes(
    server: ServerProcess,
) -> None:
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    on_error = {m["name"]: m.get("on_error") for m in info["models"]}
    assert on_error == {
        "rm": None,
        "check": "mask",
        "filled": 0.5,
        "down": "mask",
        "judge": "mask",
    }


def test_shapes_without_null_fill_masked_items_and_list_them(server: ServerProcess) -> None:
    body = {"query": RESPONSES, "labels": LABELS}
    reward = httpx.post(f"{server.url}/get_reward", json=body, timeout=120)
    assert reward.status_code == 200, reward.text
    data = reward.json()
    assert data["rewards"][1:] == [0.0] * 5 and data["rewards"][0] != 0.0
    assert data["extra_logs"]["masked"] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert reward.headers["X-Reward-Masked"] == "1,2,3,4,5"
    classify = httpx.post(f"{server.url}/classify", json={"input": RESPONSES[:3]}, timeout=120)
    # No labels: the python verifier scores len(response) for every item, nothing masked.
    assert classify.status_code == 200 and "X-Reward-Masked" not in classify.headers


def test_a_bad_deadline_is_a_422_and_a_spent_one_masks_every_item(server: ServerProcess) -> None:
    for value in ("soon", "-5", "0", "nan"):
        r = httpx.post(
            f"{server.url}/score",
            json={"texts": ["a"]},
            headers={"X-Request-Timeout-Ms": value},
            timeout=30,
        )
        assert r.status_code == 422 and r.json()["type"] == "bad_deadline", (value, r.text)
    r = httpx.post(f"{server.url}/score", json={"texts": ["a"], "timeout_ms": -1}, timeout=30)
    assert r.status_code == 422, r.text
    # A deadline far shorter than any model takes: every item masked, none scored.
    data = score(server, texts=RESPONSES, labels=LABELS, timeout_ms=0.001)
    assert data["scores"] == [None] * 6 and data["masked"] == ["deadline"] * 6


def test_the_body_deadline_bounds_a_hanging_item(server: ServerProcess) -> None:
    data = score(server, texts=["x", "fine"], labels=["sleep", "ok"], model="check", timeout_ms=600)
    # "deadline", not "timeout": the request's 0.6 s came before the item's own 1.5 s.
    assert data["masked"][0] == "deadline" and data["scores"][1] == 4.0


# -- a verifier that hangs on every item, under a deadline ------------------------------------

ITEMS = 64
DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def hanging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("hanging")
    with serve(models=[python("hang", workers=4, timeout_s=30)], folder=folder) as srv:
        yield srv


def worker_pids(server: ServerProcess) -> set[float]:
    data = score(server, texts=[f"p{i}" for i in range(16)], labels=["pid"] * 16)
    return {s for s in data["scores"] if s is not None}


def test_a_deadline_answers_a_request_whose_verifier_hangs_on_every_item(
    hanging: ServerProcess,
) -> None:
    before = worker_pids(hanging)
    answer: dict[str, Any] = {}

    def request() -> None:
        started = time.monotonic()
        answer["response"] = httpx.post(
            f"{hanging.url}/score",
            json={"texts": [f"t{i}" for i in range(ITEMS)], "labels": ["sleep"] * ITEMS},
            headers={"X-Request-Timeout-Ms": str(int(DEADLINE_S * 1000))},
            timeout=60,
        )
        answer["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=request)
    thread.start()
    health: list[int] = []
    while thread.is_alive():
        health.append(httpx.get(f"{hanging.url}/health", timeout=5).status_code)
        time.sleep(0.25)
    thread.join()
    response = answer["response"]
    assert response.status_code == 200, response.text + "\n" + hanging.log()[-4000:]
    assert answer["seconds"] <= DEADLINE_S + 1.0, answer["seconds"]
    data = response.json()
    assert data["scores"] == [None] * ITEMS
    assert set(data["masked"]) <= {"deadline", "timeout"} and len(data["masked"]) == ITEMS
    assert len(health) >= 20 and set(health) == {200}, health
    # The hung workers were killed: the next request is served by new ones.
    after = worker_pids(hanging)
    assert after and not (after & before), (before, after)


# -- work queued behind a long request: a deadline or a disconnect drops it unstarted ----------

#: Items of the long request, one row per pass: the first size, then larger ones while the
#: long request ends before the short one is answered (a faster CPU runs the rows sooner).
LONG_SIZES = (160, 640, 2560)


@pytest.fixture(scope="module")
def one_row_passes(
    gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("queued")
    flags = ("--max-batch-size", "1", "--score-cache-size", "0")
    flags += ("--max-client-batch", str(max(LONG_SIZES)))
    rm = {"name": "rm", "model": str(gpt2_rm)}
    with serve(None, *flags, models=[rm], folder=folder) as srv:
        yield srv


def rows_run(server: ServerProcess) -> float:
    """Rows the model ran in its passes (its own count)."""
    return metric(server.url, "reward_server_model_batch_rows_sum", model="rm")


def dropped(server: ServerProcess) -> float:
    return metric(server.url, "reward_server_model_dropped_rows_total", model="rm")


def end_short_request_behind_long_one(
    server: ServerProcess, ending: str, long: int
) -> tuple[bool, httpx.Response]:
    """A request of ``long`` items, one row per pass, and three short items queued behind it
    whose request ends (its deadline passes, or its client goes) while they wait. Returns
    whether the long request was still running when the short one had ended, and its answer."""
    long_text = " ".join(["a long text scored one row at a time"] * 30)
    rows_before = rows_run(server)
    long_answer: dict[str, httpx.Response] = {}

    def long_request() -> None:
        long_answer["response"] = httpx.post(
            f"{server.url}/score",
            json={"texts": [f"{i} {long_text}" for i in range(long)]},
            timeout=300,
        )

    thread = threading.Thread(target=long_request)
    thread.start()
    # Wait until the long request's rows are queued, then queue three short items behind.
    deadline = time.monotonic() + 30
    while rows_run(server) == rows_before and time.monotonic() < deadline:
        time.sleep(0.05)
    short = {"texts": ["x", "y", "z"]}
    answer: httpx.Response | None = None
    if ending == "deadline":
        answer = httpx.post(f"{server.url}/score", json={**short, "timeout_ms": 300}, timeout=30)
    else:
        with contextlib.suppress(httpx.ReadTimeout):  # the client goes: the expected ending
            answer = httpx.post(f"{server.url}/score", json=short, timeout=0.3)
    still_running = thread.is_alive()
    thread.join()
    if still_running:  # the short items were still queued when their request ended
        if ending == "deadline":
            assert answer is not None and answer.json()["masked"] == ["deadline"] * 3, answer
        else:
            assert answer is None, answer.text
    return still_running, long_answer["response"]


@pytest.mark.parametrize("ending", ["deadline", "disconnect"])
def test_queued_items_whose_request_ended_never_reach_the_model(
    one_row_passes: ServerProcess, ending: str
) -> None:
    server = one_row_passes
    for long in LONG_SIZES:
        rows_before, dropped_before = rows_run(server), dropped(server)
        still_running, response = end_short_request_behind_long_one(server, ending, long)
        assert response.status_code == 200
        if still_running:
            break
        # The long request ended first: the short items ran or were dropped; once the counts
        # show either, again with a longer request.
        settled = rows_before + dropped_before + long + 3
        wait_for(lambda n=settled: rows_run(server) + dropped(server) >= n)
    assert still_running, "the long request ended first at every size: nothing queued behind"
    # The short request's rows were dropped unstarted (the counter), and the model ran the
    # long request's rows only (its own row count).
    assert wait_for(lambda: dropped(server) - dropped_before == 3.0)
    assert rows_run(server) - rows_before == float(long)


def wait_for(condition: Any, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


# -- a sandbox that fails: the code verifier's items are masked sandbox_error -------------------


@pytest.fixture
def failing_sandbox() -> Iterator[tuple[Path, Path]]:
    """A bwrap that works until ``flag`` exists, then fails as a broken sandbox would (in a
    folder the sandbox's own user can read: a root server runs bwrap as another uid)."""
    found, where = find_bwrap()
    assert found is not None, where
    folder = Path(tempfile.mkdtemp(prefix="masks-bwrap-"))
    folder.chmod(0o755)
    flag = folder / "broken"
    wrapper = folder / "bwrap"
    wrapper.write_text(
        f'#!/bin/sh\nif [ -e "{flag}" ]; then echo "bwrap: cannot set up the sandbox" >&2; '
        f'exit 1; fi\nexec "{found}" "$@"\n',
        encoding="utf-8",
    )
    wrapper.chmod(0o755)
    try:
        yield wrapper, flag
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_sandbox_that_fails_masks_its_items(
    failing_sandbox: tuple[Path, Path], tmp_path: Path
) -> None:
    wrapper, flag = failing_sandbox
    entry = {"name": "code", "kind": "verifier", "verifier": "code", "bwrap": str(wrapper)}
    program = "```python\nprint(sum(map(int, input().split())))\n```"
    body = {"texts": [program], "labels": [{"inputs": ["1 2\n"], "outputs": ["3\n"]}]}
    with serve(models=[entry], folder=tmp_path) as srv:
        works = httpx.post(f"{srv.url}/score", json=body, timeout=120).json()
        assert works["scores"] == [1.0], works
        flag.touch()
        broken = httpx.post(f"{srv.url}/score", json=body, timeout=120).json()
        assert broken["scores"] == [None] and broken["masked"] == ["sandbox_error"], broken
        counted = metric(
            srv.url, "reward_server_masked_items_total", model="code", reason="sandbox_error"
        )
        assert counted == 1.0
