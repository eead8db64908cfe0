"""Streaming rewards with the transformers engine (issue 22, acceptance 4): while ``generate``
runs on a chunk, each group of ``reward_stream_size`` rows that have emitted the stop token
is decoded and sent to the reward, the other rows still generating.

The policy is the tiny GPT-2 with its stop token's output row made to fire at varied steps
(``bench.rollout.spread_stop_token``, as the rollout benchmark does), so its rows end at
different steps. Generation progress is observed through a hook on the policy's forward
(each decoding step is a one-token forward) and reward requests where the collector hands
them to its executor, so "before generation ends" is an order of events, not a timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.training import PROMPTS, ppo_config
from server_proc import running_server, score_requests
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from bench.rollout import spread_stop_token
from ppo_client import PPOTrainer, ppo
from ppo_client.rollout import (
    FinishedRows,
    Rollout,
    encode_prompts,
    generate_responses,
    pad_token_id_for,
    sampling_config,
)
from ppo_client.timing import RolloutClock
from reward_client import RewardClient

LENGTH = 16
ROWS = 8


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GPT-2 policy whose responses (stop token: EOS) end at varied steps."""
    source = tiny_models.save_gpt2_policy(tmp_path_factory.mktemp("gpt2_policy"))
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    tok = AutoTokenizer.from_pretrained(source)
    enc = encode_prompts(tok, PROMPTS[:16], pad_token_id_for(tok))
    spread_stop_token(model, tok.eos_token_id, enc.input_ids, enc.attention_mask, LENGTH, 6.0)
    return tiny_models.save(tmp_path_factory.mktemp("spread_policy"), model, tok)


@pytest.fixture(scope="module")
def server(bert_rm: Path) -> Iterator[Any]:
    # No score cache: the unstreamed run's texts are the streamed run's, and cached answers
    # would make their scores equal whatever the requests were. A busy machine starts slowly.
    with running_server(bert_rm, "--score-cache-size", "0", timeout=300) as srv:
        yield srv


def test_finished_rows_are_handed_over_in_groups_as_they_finish(policy: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    tok = AutoTokenizer.from_pretrained(policy)
    stop = pad = tok.eos_token_id  # pad == stop: only a row's first stop token counts
    enc = encode_prompts(tok, PROMPTS[16 : 16 + ROWS], pad)
    config = sampling_config(LENGTH, 1.0, stop, pad)
    calls: list[tuple[list[int], torch.Tensor, int]] = []
    context = enc.input_ids.size(1)

    def on_finished(rows: list[int], responses: torch.Tensor) -> None:
        calls.append((rows, responses.clone(), steps[0]))

    steps = [0]  # decoding steps so far, counted by a hook on the forward
    model.register_forward_pre_hook(lambda _m, _a: steps.__setitem__(0, steps[0] + 1))
    watcher = FinishedRows(stop, context, LENGTH, pad, 2, on_finished)
    torch.manual_seed(3)
    watched = generate_responses(model, enc.input_ids, enc.attention_mask, config, ROWS, watcher)
    total_steps = steps[0]
    torch.manual_seed(3)
    plain = generate_responses(model, enc.input_ids, enc.attention_mask, config, ROWS)
    assert torch.equal(watched, plain)  # the watcher changes no row and no step

    lengths = ppo.sequence_lengths(plain, stop)  # index of the stop token, or LENGTH - 1
    finished = [r for r in range(ROWS) if bool(plain[r, : int(lengths[r]) + 1].eq(stop).any())]
    handed = [r for rows, _, _ in calls for r in rows]
    assert all(len(rows) == 2 for rows, _, _ in calls)
    assert sorted(handed + watcher.pending) == finished  # each finished row once, no other
    assert len(watcher.pending) < 2
    for rows, responses, step in calls:
        # handed over at the step its last row finished, with the tokens it will keep
        assert step == max(int(lengths[r]) + 1 for r in rows)
        assert torch.equal(responses, plain[rows])
    # the fixture's point: rows end at different steps, some well before generation does
    assert calls and calls[0][2] < total_steps
    assert len(set(lengths.tolist())) >= 3


class _RecordingPool(ThreadPoolExecutor):
    """The reward worker thread, noting in ``events`` each request handed to it."""

    def __init__(self, events: list[tuple[str, int]]) -> None:
        super().__init__(max_workers=1, thread_name_prefix="ppo-reward")
        self.events = events

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.events.append(("request", len(args[-1].responses)))  # the RewardInputs
        return super().submit(fn, *args, **kwargs)


def _rollout(
    policy: Path, out: Path, url: str, stream: bool, stop: str | None
) -> tuple[Rollout, list[tuple[str, int]]]:
    """One update's rollouts of a fresh trainer (seeded alike), with the events: each
    forward of the policy (its width: 1 while decoding) and each reward request."""
    cfg = ppo_config(
        policy,
        out,
        response_length=LENGTH,
        stop_token=stop,
        stream_rewards=stream,
        reward_stream_size=2,
        local_rollout_forward_batch_size=ROWS,
        overlap_reward=True,
    )
    events: list[tuple[str, int]] = []
    with RewardClient(url) as client, _RecordingPool(events) as pool:
        trainer = PPOTrainer(cfg, train_dataset=[{"prompt": p} for p in PROMPTS], reward_fn=client)
        wrapper = trainer.accelerator.unwrap_model(trainer.model)

        def note(_m: object, _a: object, kwargs: dict[str, Any]) -> None:
            events.append(("forward", int(kwargs["input_ids"].size(1))))

        wrapper.policy.register_forward_pre_hook(note, with_kwargs=True)
        torch.manual_seed(11)
        rollout = trainer.rollouts.collect(trainer.model, PROMPTS[:ROWS], pool)
    return rollout, events


@pytest.mark.parametrize("stop", ["eos", None], ids=["stop-token", "no-stop-token"])
def test_streamed_rollouts_score_as_unstreamed_ones_and_go_out_during_generation(
    policy: Path, server: Any, tmp_path: Path, stop: str | None
) -> None:
    before = score_requests(server.url)
    streamed, events = _rollout(policy, tmp_path / "s", server.url, True, stop)
    plain, plain_events = _rollout(policy, tmp_path / "p", server.url, False, stop)

    assert torch.equal(streamed.responses, plain.responses)
    assert streamed.texts == plain.texts
    assert streamed.reward_tail_s >= 0 and plain.reward_tail_s >= 0
    # the same scores in row order: the same texts, scored in other batches (groups of 2
    # against one of 8), within the server's float32 batch invariance (its bound: 1e-5)
    assert streamed.raw_scores.tolist() == pytest.approx(plain.raw_scores.tolist(), abs=1e-5)
    # ... and the server's own scores of those texts, in that order
    with RewardClient(server.url) as client:
        again = client.score(queries=plain.texts.prompts, responses=plain.texts.responses)
    assert again == pytest.approx(plain.raw_scores.tolist(), abs=1e-6)

    def last_decode(evts: list[tuple[str, int]]) -> int:
        return max(k for k, (kind, width) in enumerate(evts) if kind == "forward" and width == 1)

    def requests(evts: list[tuple[str, int]]) -> list[int]:
        return [k for k, (kind, _) in enumerate(evts) if kind == "request"]

    sizes = [n for kind, n in events if kind == "request"]
    assert sum(sizes) == ROWS and max(sizes) <= 2  # reward_stream_size at a time
    assert [n for kind, n in plain_events if kind == "request"] == [ROWS]  # one per chunk
    assert min(requests(plain_events)) > last_decode(plain_events)
    early = [k for k in requests(events) if k < last_decode(events)]
    if stop is None:  # every row runs the full length: nothing to send before the end
        assert not early
    else:  # rows that ended early were sent while the others still generated
        assert early
        assert len(set(plain.seq_lengths.tolist())) >= 3  # they end at varied steps
    # every request reached the server and was answered
    assert score_requests(server.url) - before == len(sizes) + 1 + 1


def _clock(*times: float) -> RolloutClock:
    """A clock that reads ``times`` in turn."""
    reads = iter(times)
    return RolloutClock(now=lambda: next(reads))


def test_the_reward_tail_runs_from_the_end_of_sampling_to_the_last_answer() -> None:
    """``time/reward_tail_s``: the reward work left when generation ended (answers that
    came before it count for nothing)."""
    clock = _clock(10.0, 9.0, 12.5, 11.0)
    clock.sampled()  # at 10.0
    assert clock.reward_tail_s == 0.0  # nothing sent
    for _ in range(3):
        clock.scored()  # at 9.0, 12.5, 11.0
    assert clock.reward_tail_s == 2.5
    clock = _clock(10.0, 8.0, 9.5)
    clock.sampled()
    clock.scored()
    clock.scored()  # all answered while the last rows generated
    assert clock.reward_tail_s == 0.0


def test_time_in_a_nested_phase_is_the_inner_phases_only() -> None:
    """A request handed to the reward while rows generate is a wait, not generation; time
    outside every phase (the passes) counts nowhere."""
    clock = _clock(0.0, 1.0, 1.5, 1.5, 4.0, 4.25, 7.0, 9.0)
    with clock.generating():  # 0.0 .. 4.25: sampling
        with clock.generating():  # 1.0 .. 1.5: decoding rows that finished
            pass
        with clock.waiting():  # 1.5 .. 4.0: handing them over (an inline reward scores)
            pass
    # 4.25 .. 7.0: outside every phase (the passes)
    with clock.waiting():  # 7.0 .. 9.0: gathering the answers
        pass
    assert clock.generate_s == 1.0 + 0.5 + 0.25
    assert clock.reward_wait_s == 2.5 + 2.0
