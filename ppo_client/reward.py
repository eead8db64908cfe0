"""The reward as the trainer calls it: any ``(prompts, responses) -> scores`` callable or a
:class:`~reward_client.RewardClient`, on a worker thread (overlapped with the rollout's
forward passes) or inline. With ``label_column`` it is also given ``labels=`` (one per
prompt)."""

from __future__ import annotations

import inspect
import ipaddress
import math
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import torch

from ppo_client.config import ConfigError, PPOConfig
from ppo_client.rollout import Prompt, RewardInputs, Scores
from ppo_client.streaming import NO_REASON

__all__ = [
    "RewardFn",
    "check_labels_taken",
    "check_process_reward",
    "default_overlap",
    "default_reward_fn",
    "reward_executor",
    "score_rollouts",
]

#: Any callable ``(prompts, responses) -> scores`` can be the reward (with ``label_column``:
#: ``(prompts, responses, labels=labels) -> scores``); a None score masks that rollout (it
#: is left out of the update).
RewardFn = Callable[[list[Prompt], list[str]], Sequence[float | None]]


def default_reward_fn(config: PPOConfig) -> RewardFn:
    """A RewardClient for ``config.reward_url``."""
    if not config.reward_url:
        raise ConfigError("set reward_url (the reward server) or pass reward_fn")
    from reward_client import RewardClient

    options: dict[str, Any] = {
        "timeout": config.reward_timeout,
        "retry_timeout": config.reward_retry_timeout,
        "max_retries": config.reward_max_retries,
        "protocol": config.reward_protocol,
        "verify": config.reward_ca_bundle or config.reward_tls_verify,
    }
    try:
        return RewardClient(config.reward_url, api_key=config.reward_api_key, **options)
    except ValueError as exc:  # a CA bundle that cannot be read, a malformed URL
        raise ConfigError(str(exc).replace("verify:", "reward_ca_bundle:", 1)) from None


def score_rollouts(reward_fn: RewardFn, inputs: RewardInputs) -> Scores:
    """Call the reward function (on the worker thread); scores and, if known, truncation.

    An object with ``score_pairs_detailed`` or ``score_detailed`` (the RewardClient) also
    reports which inputs the server truncated, and a process model's steps; chat prompts go
    to ``score_detailed`` as conversations ending with the response. Labels, when the
    inputs have them, go as ``labels=``. A None score is a masked item (its reward could
    not be computed); its reason comes from the result's ``masked`` when it has one, else
    it is :data:`NO_REASON`.
    """
    fn: Any = reward_fn
    prompts, responses = inputs.prompts, inputs.responses
    labelled = {} if inputs.labels is None else {"labels": inputs.labels}
    truncated: list[bool] | None = None
    result: Any = None
    if hasattr(fn, "score_pairs_detailed"):
        result = fn.score_pairs_detailed(prompts, responses, **labelled)
        scores, truncated = list(result.scores), list(result.truncated)
    elif hasattr(fn, "score_detailed"):
        if all(isinstance(p, str) for p in prompts):
            result = fn.score_detailed(queries=prompts, responses=responses, **labelled)
        else:
            conversations = [
                [*p, {"role": "assistant", "content": r}]
                for p, r in zip(prompts, responses, strict=True)
            ]
            result = fn.score_detailed(conversations=conversations, **labelled)
        scores, truncated = list(result.scores), list(result.truncated)
    else:
        scores = list(fn(prompts, responses, **labelled))
    if len(scores) != len(responses):
        raise ValueError(
            f"the reward function returned {len(scores)} scores for {len(responses)} responses"
        )
    scores = [None if s is None else float(s) for s in scores]
    if not all(s is None or math.isfinite(s) for s in scores):
        raise ValueError(f"the reward function returned a non-finite score: {scores}")
    steps = [getattr(result, key, None) for key in ("step_scores", "step_ends", "outcome_scores")]
    return Scores(scores, truncated, *steps, masked=_masked_reasons(scores, result))


def _masked_reasons(scores: list[float | None], result: Any) -> list[str | None] | None:
    """Each item's reason for a None score (None for a scored item); None when no item is
    masked. The reasons are the result's ``masked`` (the RewardClient's), else
    :data:`NO_REASON`."""
    if all(s is not None for s in scores):
        return None
    given = getattr(result, "masked", None)
    if given is not None and len(given) != len(scores):
        given = None
    return [
        None if s is not None else (given[k] if given is not None and given[k] else NO_REASON)
        for k, s in enumerate(scores)
    ]


def check_labels_taken(reward_fn: object, label_column: str | None) -> None:
    """Fail at start-up when ``label_column`` is set but the reward takes no ``labels=``
    (a reward whose signature cannot be read is left to its first call)."""
    if label_column is None:
        return
    names = ("score_pairs_detailed", "score_detailed")
    fn = next((getattr(reward_fn, n) for n in names if hasattr(reward_fn, n)), reward_fn)
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    if not any(p.name == "labels" or p.kind is p.VAR_KEYWORD for p in parameters):
        raise ConfigError(
            f"label_column is {label_column!r} but the reward function takes no labels= "
            "keyword: give it a labels parameter, or unset label_column"
        )


def check_process_reward(reward_fn: object) -> None:
    """Fail at start-up when ``reward_mode: process`` meets a reward server whose ``/info``
    lists no ``kind: process`` model (reward functions without ``info`` are checked at the
    first call)."""
    info_fn = getattr(reward_fn, "info", None)
    if not callable(info_fn):
        return
    info = info_fn()
    models = info.get("models") if isinstance(info, dict) else None
    if not isinstance(models, list):
        raise ConfigError(
            "reward_mode is process but the reward server's /info lists no models: it is "
            "not a composite reward server (or predates one) and gives no step scores"
        )
    kinds = [(m.get("name"), m.get("kind", "sequence")) for m in models if isinstance(m, dict)]
    if not any(kind == "process" for _, kind in kinds):
        served = ", ".join(f"{name} ({kind})" for name, kind in kinds) or "none"
        raise ConfigError(
            "reward_mode is process but the reward server serves no kind: process model "
            f"(it serves: {served}); add a process reward model to its models file or use "
            "reward_mode: outcome"
        )


def _on_this_machine(url: str) -> bool:
    """True when ``url``'s host is this machine (a loopback or unspecified address, or its
    own host name)."""
    host = (urlsplit(url).hostname or "").lower()
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return ip.is_loopback or ip.is_unspecified
    # A name: compare with this host's own (getfqdn may ask DNS, so it goes last).
    return host in ("localhost", socket.gethostname().lower()) or host == socket.getfqdn().lower()


def default_overlap(reward_fn: object, device: torch.device) -> bool:
    """Whether the trainer overlaps reward calls with its passes when not told.

    Overlap hides the reward's time only where the reward has processors of its own: an
    HTTP client to a server elsewhere, or any server while the trainer runs on a GPU. A
    reward computed in process, or a server on this machine while the trainer runs on its
    CPU, competes with the passes for the same cores; two busy-waiting thread teams on them
    made CPU steps slower, not faster (BENCHMARKS.md, PPO step).
    """
    from reward_client import RewardClient

    if not isinstance(reward_fn, RewardClient):
        return False
    if device.type != "cpu":
        return True
    return not all(_on_this_machine(url) for url in reward_fn.base_urls)


class _InlineExecutor(Executor):
    """Runs each submitted call at once on the calling thread (the reward not overlapped)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def reward_executor(overlap: bool) -> Executor:
    """Where reward calls run: one worker thread ("ppo-reward") when overlapped, else inline."""
    if overlap:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppo-reward")
    return _InlineExecutor()
