"""A component scored by another HTTP service: ``kind: remote`` entries of the models file.

Through :mod:`reward_client` (its retry policy, failover over several URLs, ``dns+http://``
names): another reward server (``protocol: remote-reward``, labels passed on), a vLLM or TEI
reward model (``vllm``, ``tei``), or an OpenAI-compatible chat endpoint used as a judge
(``openai-chat``: the entry's Jinja ``template``, rendered as a judge's
(:mod:`reward_server.text.judge_prompt`), is the one user message of ``POST
/v1/chat/completions``; the first group of ``score_pattern`` in the reply is the score).

Every HTTP request to the service (retries and the client's own ``/info`` included) waits
for one of ``max_concurrent`` connection seats, in the server's fair queue under its
request's tenant (:class:`~reward_server.scheduling.seats.Seats`), then, with ``max_rpm``,
for its turn in a sliding window of 60 s holding at most ``max_rpm`` request starts.
``timeout_s`` (default 30) is both the time limit of one request (from when it has its seat)
and the client's retry budget of one call. The remote's items are admitted as every
scheduler's (``--max-queue`` at once, a tenant's share of them).

Like a verifier's, an item the remote finally failed on is not an error of the request: it
scores the entry's ``on_error``, its reason (``remote_error``, ``timeout``, or ``parse_failure`` for
a reply without a number) is counted in ``reward_server_remote_errors_total`` and returned in
the answer's ``verifier_errors``. The key is read from the environment variable named by
``api_key_env`` at start-up and never shown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any, ClassVar, cast

import httpx

from reward_client import AsyncRewardClient, RetryPolicy, RewardClientError
from reward_client.wire.openai_chat import chat_body, parse_score, reply_text
from reward_server.config.tenants import current_tenant
from reward_server.errors import ModelLoadError, NotReadyError, UnrenderableError
from reward_server.scheduling.fairness import Admission
from reward_server.scheduling.rate_limit import RateLimiter
from reward_server.scheduling.seats import Seats
from reward_server.scoring.deadline import current_deadline
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import Items, judge_prompts, tasks
from reward_server.scoring.metrics import ModelState
from reward_server.text.judge_prompt import JudgeTemplate
from reward_server.text.messages import ToolRendering

if TYPE_CHECKING:
    from reward_server.config.remote_entry import RemoteEntry
    from reward_server.scoring.served import ServingContext
    from reward_server.verifiers import Task

__all__ = ["RemoteModel", "load_remote"]

logger = logging.getLogger(__name__)

#: ``timeout_s`` of a remote entry that does not set it.
DEFAULT_REMOTE_TIMEOUT_S = 30.0
#: Calls a light tenant's request may make first, per unit of weight (the fair queue's burst).
CALLS_BURST = 16


class _Limited(httpx.AsyncBaseTransport):
    """A transport that holds one of ``max_concurrent`` connection seats for each request
    (then waits for its start in the ``max_rpm`` window), its answer's body read before the
    seat is given back. The seats are the server's fair queue: a request waits there under
    its tenant, so a tenant flooding the remote does not hold the others behind its
    backlog."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        slots: int,
        rate: RateLimiter | None,
        timeout_s: float,
    ) -> None:
        self.inner = inner
        self.slots = Seats(slots, burst=CALLS_BURST, closed="the remote component is closed")
        self.rate = rate
        self.timeout_s = timeout_s

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async with self.slots.seat(current_tenant.get()):
            if self.rate is not None:  # the max_rpm window: in the seat's fair order
                await self.rate.acquire()
            try:
                return await asyncio.wait_for(self._send(request), self.timeout_s)
            except asyncio.TimeoutError:
                # The client sees it as the timeout it is (retried within its budget).
                raise httpx.ReadTimeout(
                    f"no answer within {self.timeout_s:g} s", request=request
                ) from None

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """The answer, its body read (the slot is held until then)."""
        response = await self.inner.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _reason(exc: BaseException) -> str:
    """``timeout`` where the last failure was a timeout, else ``remote_error``."""
    cause = exc.__cause__
    return "timeout" if isinstance(cause, httpx.TimeoutException) else "remote_error"


def _response(task: Task) -> dict[str, Any]:
    """The response as the assistant's message: its text, tool calls and kept reasoning."""
    message: dict[str, Any] = {"role": "assistant", "content": task.response}
    if task.tool_calls:
        message["tool_calls"] = task.tool_calls
    if task.reasoning:
        message["reasoning_content"] = task.reasoning
    return message


def _conversation(task: Task) -> list[dict[str, Any]] | dict[str, Any]:
    """The item as a conversation (with its tools: a ``{"messages", "tools"}`` object)."""
    prompt = task.prompt
    before = (
        [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or [])
    )
    messages = [*before, _response(task)]
    return {"messages": messages, "tools": task.tools} if task.tools else messages


def _agentic(task: Task) -> bool:
    """Whether the item carries tool calls, tool results or tools."""
    earlier = task.prompt if isinstance(task.prompt, list) else []
    used = any(m.get("role") == "tool" or m.get("tool_calls") for m in earlier)
    return bool(used or task.tools or task.tool_calls)


def _inputs(work: list[Task], protocol: str) -> dict[str, Any]:
    """The items as reward_client's inputs: texts, pairs, or conversations (labels for
    remote-reward only). Tool calls, results and tools go to another remote-reward server as
    they are; UnrenderableError for a protocol that cannot carry them."""
    prompts = [t.prompt for t in work]
    if any(_agentic(t) for t in work):
        if protocol != "remote-reward":
            raise UnrenderableError(
                f"cannot send tool calls, tool results or tools over protocol {protocol!r} "
                "(only remote-reward carries them)"
            )
        inputs: dict[str, Any] = {"conversations": [_conversation(t) for t in work]}
    elif all(p is None for p in prompts):
        inputs = {"texts": [t.response for t in work]}
    elif all(isinstance(p, str) for p in prompts):
        inputs = {"queries": prompts, "responses": [t.response for t in work]}
    else:
        inputs = {"conversations": [_conversation(t) for t in work]}
    if protocol == "remote-reward" and any(t.label is not None for t in work):
        inputs["labels"] = [t.label for t in work]
    return inputs


class RemoteModel:
    """A ``kind: remote`` entry, served: its reward_client and limits (made in start())."""

    kind = "remote"
    #: Its one value: the score.
    labels: ClassVar[list[str]] = ["score"]
    # Nothing loaded here, no micro-batcher: the remote service does the work.
    scorer = scheduler = None
    max_batch_tokens: int | None = None

    def __init__(
        self,
        spec: RemoteEntry,
        template: JudgeTemplate | None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        rate: RateLimiter | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.template = template
        self.timeout_s = spec.call_timeout_s or DEFAULT_REMOTE_TIMEOUT_S
        self.running = False
        self._transport = transport  # the test seam (default: httpx's)
        self._rate = rate
        self._pattern = re.compile(spec.score_pattern) if spec.score_pattern else None
        self._ctx: ServingContext | None = None
        self._client: AsyncRewardClient | None = None
        self._http: httpx.AsyncClient | None = None
        self._admission: Admission | None = None

    @property
    def queued(self) -> int:
        """Items being scored by the remote now."""
        return 0 if self._admission is None else self._admission.queued

    def _api_key(self) -> str | None:
        name = self.spec.api_key_env
        if name is None:
            return None
        key = os.environ.get(name)
        if not key:
            raise ModelLoadError(
                f"remote {self.name!r}: environment variable {name} (api_key_env) is not set"
            )
        return key

    def make_client(self) -> AsyncRewardClient:
        """The entry's client, its HTTP requests through the limits (on the running loop)."""
        spec = self.spec
        rate = self._rate
        if rate is None and spec.max_rpm is not None:
            rate = RateLimiter(spec.max_rpm)
        inner = self._transport or httpx.AsyncHTTPTransport()
        # Waiting for a seat is no pool timeout: the seats queue requests, not the pool.
        timeout = httpx.Timeout(self.timeout_s, pool=None)
        http = self._http = httpx.AsyncClient(
            transport=_Limited(inner, spec.max_concurrent, rate, self.timeout_s), timeout=timeout
        )
        protocol = "remote-reward" if spec.protocol == "openai-chat" else spec.protocol
        return AsyncRewardClient(
            spec.url or [],
            self._api_key(),
            http_client=http,
            timeout=timeout,
            retry=RetryPolicy(timeout=self.timeout_s),
            # A call's chunks (up to a light tenant's burst) wait for their seats together,
            # so the fair queue sees the request whole; the seats bound the connections.
            max_concurrency=max(spec.max_concurrent, CALLS_BURST),
            protocol=protocol,
        )

    async def start(self, ctx: ServingContext) -> None:
        """Take the registry's context, make the client, and admit as every scheduler does
        (--max-queue items at once, a tenant's share of them)."""
        self._ctx = ctx
        self._admission = Admission(ctx.settings.max_queue, ctx.buckets)
        self._client = self.make_client()
        self.running = True

    def snapshot(self) -> ModelState | None:
        """Items the remote is scoring, for /metrics at a scrape; None until started."""
        return None if self._ctx is None else ModelState(self.name, self.queued)

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work and close the client."""
        self.running = False
        http, self._client, self._http = self._http, None, None
        if http is not None:
            await http.aclose()

    async def score(
        self, items: Items, *, truncate: bool, max_tokens: int | None, cache: bool = True
    ) -> list[ItemResult]:
        """Score every item remotely (never raises for a failing remote: ``on_error``).
        No score cache: ``cache`` is ignored (see score_cache.caches_kind)."""
        ctx, client, admission = self._ctx, self._client, self._admission
        if ctx is None or client is None or admission is None or not self.running:
            raise NotReadyError("the remote component is not running")
        work = await asyncio.get_running_loop().run_in_executor(
            ctx.tokenizer, tasks, items, ctx.policy_template
        )
        with admission.admitted(current_tenant.get(), len(work)):
            if self.spec.protocol == "openai-chat":
                results = await self._judge(client, items, ctx)
            else:
                results = await self._reward(client, work)
        for result in results:
            if result.error is not None:
                ctx.metrics.on_remote_error(self.name, result.error)
        ctx.metrics.on_model_items(self.name, len(results), 0)
        return results

    def _failed(self, reason: str) -> ItemResult:
        return ItemResult(self.spec.error_score, num_tokens=0, truncated=False, error=reason)

    async def _reward(self, client: AsyncRewardClient, work: list[Task]) -> list[ItemResult]:
        inputs = _inputs(work, self.spec.protocol)
        if self.spec.remote_model is not None:
            inputs["model"] = self.spec.remote_model
        deadline = current_deadline.get()
        if deadline is not None:
            # The remote gets what is left of this request's time (the client sends it on,
            # and stops retrying at it), never more than the entry's own budget.
            inputs["deadline"] = max(0.001, min(self.timeout_s, deadline - time.monotonic()))
        try:
            result = await client.score_detailed(**inputs)
        except (RewardClientError, ValueError, TypeError) as exc:
            cut = deadline is not None and time.monotonic() >= deadline
            reason = "deadline" if cut else _reason(exc)
            logger.warning("remote %s failed on %d item(s): %s", self.name, len(work), exc)
            return [self._failed(reason) for _ in work]
        # A remote reward server masks the items it could not score (null, with a reason):
        # here they fail with the remote's reason (remote_error where the remote gave none
        # the client could read), so the entry's on_error applies to them.
        reasons = result.masked or [None] * len(result.scores)
        return [
            ItemResult(score, num_tokens=tokens, truncated=cut)
            if score is not None
            else self._failed(reason if reason not in (None, "unknown") else "remote_error")
            for score, tokens, cut, reason in zip(
                result.scores, result.tokens, result.truncated, reasons, strict=True
            )
        ]

    async def _judge(
        self, client: AsyncRewardClient, items: Items, ctx: ServingContext
    ) -> list[ItemResult]:
        assert self.template is not None and self.spec.remote_model is not None
        prompts = await asyncio.get_running_loop().run_in_executor(
            ctx.tokenizer, judge_prompts, items, ctx.policy_template
        )
        rendering = self.spec.tool_rendering or ctx.settings.tool_rendering
        texts = self.template.render(prompts, cast("ToolRendering", rendering))
        return list(await asyncio.gather(*(self._judge_one(client, t) for t in texts)))

    async def _judge_one(self, client: AsyncRewardClient, text: str) -> ItemResult:
        spec = self.spec
        assert spec.remote_model is not None and self._pattern is not None
        body = chat_body(
            spec.remote_model, text, max_tokens=spec.max_new_tokens, temperature=spec.temperature
        )
        try:
            answer = await client.chat_completion(body)
            reply = reply_text(answer)
        except RewardClientError as exc:
            logger.warning("remote judge %s failed: %s", self.name, exc)
            return self._failed(_reason(exc))
        except ValueError as exc:
            logger.warning("remote judge %s: %s", self.name, exc)
            return self._failed("remote_error")
        score = parse_score(reply, self._pattern)
        if score is None:
            return self._failed("parse_failure")
        return ItemResult(score, num_tokens=0, truncated=False)

    async def chat(
        self, messages: list[dict[str, str]], sampling: dict[str, Any]
    ) -> tuple[str, int]:
        """One chat completion of ``messages`` with ``sampling`` (max_tokens, temperature,
        top_p, seed, reasoning_effort: a grader's model leaf), through this entry's seats
        and rate, admitted as one item of the request's tenant: the reply's text and the
        tokens the endpoint counted (0 when it counts none). RewardClientError or
        ValueError when the call fails; NotReadyError when the entry is not running."""
        client, admission = self._client, self._admission
        if client is None or admission is None or not self.running:
            raise NotReadyError("the remote component is not running")
        assert self.spec.remote_model is not None
        body = {"model": self.spec.remote_model, "messages": messages, **sampling}
        with admission.admitted(current_tenant.get(), 1):
            answer = await client.chat_completion(body)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
        return reply_text(answer), tokens if isinstance(tokens, int) else 0

    def info(self) -> dict[str, object]:
        """The entry's settings for /info: the URL, protocol and model, never the key."""
        entry = self.spec.shown()
        entry.pop("api_key_env", None)  # the key's variable is the server machine's business
        if self.spec.protocol != "openai-chat":
            for key in ("template", "score_pattern", "max_new_tokens", "temperature"):
                entry.pop(key, None)
        entry["call_timeout_s"] = self.timeout_s
        return {"name": self.name, "kind": self.kind, "labels": self.labels, **entry}

    def close(self) -> None:
        """Nothing left to close: stop() closed the client."""


def load_remote(spec: RemoteEntry) -> RemoteModel:
    """A ``kind: remote`` entry: its template compiled and its key's variable checked now
    (ModelLoadError); the client is made when the registry starts."""
    template = None
    if spec.template is not None:
        template = JudgeTemplate.from_setting(spec.template, spec.name)
    model = RemoteModel(spec, template)
    model._api_key()  # a missing key fails at start-up, not on the first request
    logger.info("remote %s: %s at %s", spec.name, spec.protocol, spec.url)
    return model
