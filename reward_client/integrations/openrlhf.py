"""OpenRLHF adapter: the reward server as the ``reward_func`` file of ``--remote_rm_url``.

OpenRLHF (checked against 0.11.2) takes for ``--remote_rm_url`` either reward server URLs,
which it posts to itself (``/get_reward``, five tries a second apart, no API key), or a
Python file: it loads that file with ``importlib.util.spec_from_file_location`` and calls
its ``reward_func(queries, prompts, labels)`` on a worker thread (``asyncio.to_thread``),
once per sample as each rollout finishes. ``queries`` are the prompt and response decoded
with the policy's tokenizer *with* special tokens, as one text each; ``prompts`` the
prompts as the policy saw them; ``labels`` the dataset's ``--label_key`` column. From the
answer, a dict, it reads ``rewards`` (the reward, for the advantages), ``scores`` (for
dynamic filtering; ``rewards`` when absent) and ``extra_logs`` (logged per sample), and
makes a tensor of each.

This module is such a file; pass its path::

    --remote_rm_url "$(python -c 'import reward_client.integrations.openrlhf as m; print(m.__file__)')"

:func:`reward_func` scores each query as a complete text, as the server's own
``/get_reward`` does, through the reward client: chunks, concurrency, failover over
several URLs or a ``dns+http://`` name, retries for ``retry_timeout`` (600 s by default),
an API key, and one error when the server is finally out of reach. ``labels`` go with the
queries (for the server's verifiers and judges; left out, with a warning, for a protocol
without labels); ``prompts`` are not used. It returns ``{"rewards", "scores", "extra_logs"}``: the server's
scores as a float tensor of one value per query (``scores`` equal to ``rewards``), and
``extra_logs`` with ``reward_tokens`` (tokens scored), ``reward_truncated`` (1.0 where
the server cut the text) and ``reward_masked`` (1.0 where the server masked the item). torch
is imported inside the call; without it the values are lists of floats.

Groups: where a call holds consecutive samples of one prompt (``prompts`` equal, each query
holding its prompt), each such run goes to the server as a group (for its pairwise judges and
``normalize: group`` models), and the call's items are then sent as prompt/response pairs
(the response: the query after its prompt), since groups need prompts. OpenRLHF 0.11.2
calls ``reward_func`` once per sample, so there a call holds no group and nothing changes;
a caller that passes a prompt's samples together gets groups. ``reward_groups`` /
``REWARD_GROUPS`` = false turns grouping off.

Messages and tools: OpenRLHF 0.11.2 hands a reward function texts only: ``queries`` are
token ids decoded with the policy's template markup, ``prompts`` the templated prompt
strings; no messages, tool calls or tools reach it. Its multi-turn agents
(``--train.agent_func_path``: an ``AgentInstance`` whose ``step`` gets the observation and
the action as texts) compute their own rewards and never call ``reward_func``. So this module
scores texts. An agent that keeps its own messages can score them from its ``step`` with
:meth:`reward_client.RewardClient.score_conversations` (tool calls, tool results and tools
as OpenAI chat messages).

OpenRLHF has no notion of a sample without a reward: it makes a tensor of every
``rewards`` value (a None reward leaves the sample without one, and the experience maker
then wants a reward model), and a NaN would poison its group's baseline (the mean and
standard deviation of GRPO, RLOO, REINFORCE++-baseline). So an item the server masked (its
reward could not be computed) gets a fill value in ``rewards`` and ``scores``:
``masked_score`` / ``REWARD_MASKED_SCORE``, 0.0 by default, with one warning per call
naming how many and why, and ``extra_logs["reward_masked"]`` 1.0, which OpenRLHF logs per
sample. With ``--dynamic_filtering`` the fill value counts in its group's average score.

Settings come from keyword arguments first (OpenRLHF passes none), then the environment, as
for the verl adapter: ``REWARD_URL`` (one URL or a comma-separated list), ``REWARD_API_KEY``,
``REWARD_TIMEOUT`` (seconds per request, default 60), ``REWARD_DEADLINE`` (seconds one call
may take in all, retries included), ``REWARD_MASKED_SCORE``; see
:mod:`reward_client.integrations.settings`. One client per setting is kept for the process.

OpenRLHF loads the file outside the package, so this module imports by absolute names only
and never imports OpenRLHF.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from reward_client.groups import runs
from reward_client.integrations.masks import filled, masked_score, report_masked
from reward_client.integrations.settings import (
    CLIENT_KWARGS,
    ClientCache,
    ClientSettings,
    WarnOnce,
    flag,
)

__all__ = ["close_clients", "reward_func"]

logger = logging.getLogger(__name__)

_warn_once = WarnOnce(logger)
_clients = ClientCache()


def close_clients() -> None:
    """Close the clients :func:`reward_func` keeps for the process."""
    _clients.close()


def _values(values: list[float]) -> Any:
    """A float tensor of ``values`` where torch is installed (OpenRLHF's form), else the list."""
    try:
        import torch
    except ImportError:
        return values
    return torch.tensor(values, dtype=torch.float32)


def _grouped(
    texts: list[str],
    prompts: Sequence[Any] | None,
    kwargs: dict[str, Any],
    settings: ClientSettings,
) -> dict[str, Any] | None:
    """Pairs with the runs of one prompt as groups, when grouping is on, the protocol has
    groups, some consecutive samples share a prompt and every query holds its prompt;
    else None (the queries go as texts)."""
    protocol = dict(settings.options).get("protocol", "remote-reward")
    on = flag(kwargs.get("reward_groups", os.environ.get("REWARD_GROUPS", "1")))
    if not on or protocol != "remote-reward" or prompts is None or len(prompts) != len(texts):
        return None
    keys = [str(p) for p in prompts]
    groups = runs(keys)
    starts = [text.find(prompt) for text, prompt in zip(texts, keys, strict=True)]
    if not groups or min(starts) < 0:
        return None
    responses = [t[s + len(p) :] for t, s, p in zip(texts, starts, keys, strict=True)]
    return {"queries": keys, "responses": responses, "groups": groups}


def reward_func(
    queries: Sequence[str], prompts: Sequence[Any], labels: Sequence[Any], **kwargs: Any
) -> dict[str, Any]:
    """OpenRLHF's reward function: one reward per query (prompt and response as one text)."""
    for name in kwargs.keys() - CLIENT_KWARGS - {"masked_score", "reward_groups"}:
        _warn_once(f"kwarg:{name}", "%s ignores the keyword argument %r", __name__, name)
    if isinstance(queries, str):
        raise TypeError("queries must be a list of texts, not a single string")
    settings = ClientSettings.read(kwargs)
    fill = masked_score(kwargs)
    client = _clients.blocking(settings)
    texts = [str(q) for q in queries]
    sent = None if labels is None else settings.labels(list(labels), _warn_once)
    inputs = _grouped(texts, prompts, kwargs, settings) or {"texts": texts}
    result = client.score_detailed(**inputs, labels=sent)
    report_masked(logger, __name__, result, f"they score {fill:g} for OpenRLHF")
    rewards = _values(filled(result.scores, fill))
    return {
        "rewards": rewards,
        "scores": rewards,
        "extra_logs": {
            "reward_tokens": _values([float(t) for t in result.tokens]),
            "reward_truncated": _values([float(t) for t in result.truncated]),
            "reward_masked": _values([float(s is None) for s in result.scores]),
        },
    }
