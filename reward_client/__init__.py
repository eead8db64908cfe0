"""The reward client: score texts on a reward server over HTTP, with httpx alone.

Exceptions::

    RewardClientError            base of everything this package raises on purpose
    └── RewardServerError        a call finally failed (status, message, url)

Both clients (:class:`RewardClient`, blocking; :class:`AsyncRewardClient`, asyncio) split
a call into chunks of the server's ``max_client_batch``, send the chunks concurrently,
spread them round-robin over the base URLs (a ``dns+http://name:port`` URL stands for every
address of the name, followed as it changes: :mod:`reward_client.targets`), retry
connection errors, timeouts, 5xx and 429 (another URL first, then capped exponential
backoff with full jitter, or the server's ``Retry-After``: :class:`RetryPolicy`) until a
time budget (``retry_timeout``, 600 s by default) is spent, never retry any other 4xx, and
return scores in input order. They speak this project's server and the wire formats of
vLLM, TEI and OpenRLHF (:mod:`reward_client.wire`).

Conversations are OpenAI chat messages, carried as given: an assistant's ``tool_calls``,
``tool`` results, ``reasoning_content``, text parts; a conversation may be
``{"messages": [...], "tools": [...]}`` with tools of its own, and a call's ``tools=`` (OpenAI
function specs) go with every item without (``score_conversations``; remote-reward only).

An item the server *masked* (its reward could not be computed) scores None, with its reason
in :attr:`ScoreResult.masked`. Every request tells the server its time budget
(``X-Request-Timeout-Ms``); a call's ``deadline`` (a client option, or ``deadline=`` of one
call) bounds the whole call, retries included (:class:`ClientOptions`).

Modules, one job each: :mod:`~reward_client.errors`, :mod:`~reward_client.results`,
:mod:`~reward_client.retry`, :mod:`~reward_client.options`, :mod:`~reward_client.inputs`
(the caller's inputs as request columns), :mod:`~reward_client.targets` (base URLs and
``dns+`` names), :mod:`~reward_client.routing` (start target and failover),
:mod:`~reward_client.attempts` (retry decisions and deadlines),
:mod:`~reward_client.actions` (what flows yield), :mod:`~reward_client.flows` (the sans-I/O
core: one implementation), :mod:`~reward_client.client` (its two faces), and
:mod:`reward_client.integrations` (TRL, verl, OpenRLHF), which import their framework only
when used.
"""

from reward_client.client import AsyncRewardClient, RewardClient
from reward_client.errors import RewardClientError, RewardServerError
from reward_client.inputs import ScoreInputs
from reward_client.options import ClientOptions
from reward_client.results import RetryEvent, ScoreResult
from reward_client.retry import RetryPolicy

__all__ = [
    "AsyncRewardClient",
    "ClientOptions",
    "RetryEvent",
    "RetryPolicy",
    "RewardClient",
    "RewardClientError",
    "RewardServerError",
    "ScoreInputs",
    "ScoreResult",
]
