"""The judges of graders' model leaves (``score_model``, ``label_model``): served ``kind:
judge`` entries in ``mode: generate`` of the same models file (either engine), or ``kind: remote`` entries
with ``protocol: openai-chat`` (an OpenAI-compatible chat endpoint), by name (a grader
entry's ``models`` maps OpenAI's model names to them).

A remote judge gets the templated messages as they are, one chat completion per item
through the remote entry's own limits (its connection seats in the fair queue, its rate),
with the leaf's ``sampling_params`` as the request's ``max_tokens``, ``temperature``,
``top_p``, ``seed`` and ``reasoning_effort`` (unset ones: the entry's ``max_new_tokens`` and
``temperature``); a call that fails is a ``model_grader_server_error``.

For each item a leaf's ``input`` messages are templated, with a last system message stating
the JSON answer asked for (:func:`~reward_server.verifiers.graders.grading.model_messages`),
rendered by the judge's chat template with the generation prompt, cut to leave room for the
answer, and queued on the judge's own scheduler (its micro-batcher: fair across tenants,
batched with its other rows) as :class:`~reward_server.engines.GenerationRow`
rows carrying the leaf's ``sampling_params`` (``max_completions_tokens``, ``temperature``,
``top_p``, ``seed``; unset ones are the judge entry's). The answer is parsed (the
``{"result": float, "steps": [...]}`` object of a score model, clipped to its range; a label
of a label model) or the item fails with ``model_grader_parse_error``; a judge that is not
served or cannot render the messages fails it with ``model_grader_server_error``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reward_server.config.graders import LabelModelGrader, ScoreModelGrader
from reward_server.engines import GenerationRow
from reward_server.errors import ServiceError
from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.grading import model_messages, parse_model_answer

__all__ = ["GraderJudges", "ModelGrades"]


def _answer_tokens(judge: Any, answer: str) -> int:
    """The tokens of an answer by the judge's tokenizer (0 when it shows none)."""
    rendering = getattr(judge, "rendering", None)
    tokenizer = getattr(judge, "tokenizer", None) or getattr(rendering, "tokenizer", None)
    encode = getattr(tokenizer, "encode", None)
    return len(encode(answer, add_special_tokens=False)) if encode is not None else 0


def _remote_chat(model: Any) -> bool:
    """Whether ``model`` is a remote OpenAI-compatible chat endpoint (kind: remote,
    protocol: openai-chat)."""
    spec = getattr(model, "spec", None)
    return getattr(spec, "kind", None) == "remote" and spec.protocol == "openai-chat"


ModelLeaf = ScoreModelGrader | LabelModelGrader


@dataclass(frozen=True)
class ModelGrades:
    """One model leaf's grades of a request's items: a score or the failure of each, and
    the tokens its judge read and wrote (prompt rows; answers by the judge's tokenizer)."""

    grades: list[float | GradeFailure]
    tokens: int
    model: str


class GraderJudges:
    """The served models a grader's model leaves may name, and the calls to them."""

    def __init__(self, served: Mapping[str, Any], names: Mapping[str, str] | None = None) -> None:
        """``served``: the registry's models by name; ``names``: model name -> entry name."""
        self.served = dict(served)
        self.names = dict(names or {})

    def judge(self, model: str) -> Any:
        """The served judge answering for ``model`` (GradeFailure when there is none)."""
        entry = self.names.get(model, model)
        judge = self.served.get(entry)
        if judge is None:
            raise GradeFailure(
                "model_grader_server_error", f"no model {entry!r} is served for {model!r}"
            )
        if _remote_chat(judge):
            return judge
        usable = getattr(judge, "generates", False) and hasattr(
            getattr(judge, "judge", None), "render_chats"
        )
        if not usable or getattr(judge, "scheduler", None) is None:
            raise GradeFailure(
                "model_grader_server_error",
                f"{entry!r} is neither a kind: judge entry in mode: generate nor a kind: "
                "remote entry with protocol: openai-chat",
            )
        return judge

    def check(self, model: str) -> None:
        """GradeFailure now when ``model`` has no judge here (start-up checks)."""
        self.judge(model)

    async def grade(
        self,
        leaf: ModelLeaf,
        pairs: Sequence[tuple[Mapping[str, Any], Any]],
        tokenizer: Any = None,
    ) -> ModelGrades:
        """The leaf's grade of each ``(sample, item)``; ``tokenizer``: the executor that
        renders and tokenizes (the registry's tokenizer thread; None: inline)."""
        try:
            judge = self.judge(leaf.model)
        except GradeFailure as failure:
            return ModelGrades([failure] * len(pairs), 0, leaf.model)
        grades: list[float | GradeFailure] = [0.0] * len(pairs)
        chats: list[list[dict[str, str]]] = []
        asked: list[int] = []
        for i, (sample, item) in enumerate(pairs):
            try:
                chats.append(model_messages(leaf, sample, item))
                asked.append(i)
            except GradeFailure as failure:
                grades[i] = failure
        if not chats:
            return ModelGrades(grades, 0, leaf.model)
        if _remote_chat(judge):
            return await self._remote(leaf, judge, chats, asked, grades)
        generation = self._generation(leaf, judge)
        try:
            rows = await asyncio.get_running_loop().run_in_executor(
                tokenizer, self._rows, judge, chats, generation
            )
            answers = await judge.scheduler.submit(rows)
        except ServiceError as exc:
            failure = GradeFailure("model_grader_server_error", f"{leaf.model}: {exc}")
            for i in asked:
                grades[i] = failure
            return ModelGrades(grades, 0, leaf.model)
        tokens = sum(len(row) for row in rows)
        for i, answer in zip(asked, answers, strict=True):
            tokens += _answer_tokens(judge.judge, str(answer))
            try:
                grades[i] = parse_model_answer(leaf, str(answer))
            except GradeFailure as failure:
                grades[i] = failure
        return ModelGrades(grades, tokens, leaf.model)

    @staticmethod
    async def _remote(
        leaf: ModelLeaf,
        judge: Any,
        chats: list[list[dict[str, str]]],
        asked: list[int],
        grades: list[float | GradeFailure],
    ) -> ModelGrades:
        """The leaf's grades by a remote chat endpoint, one call per item."""
        spec = judge.spec
        params = getattr(leaf, "sampling_params", None)
        sampling: dict[str, Any] = {
            "max_tokens": (params and params.max_completions_tokens) or spec.max_new_tokens,
            "temperature": spec.temperature,
        }
        if params is not None:
            given = params.model_dump(exclude_none=True, exclude={"max_completions_tokens"})
            sampling.update(given)
        calls = await asyncio.gather(
            *(judge.chat(chat, sampling) for chat in chats), return_exceptions=True
        )
        tokens = 0
        for i, call in zip(asked, calls, strict=True):
            if isinstance(call, BaseException):
                if not isinstance(call, Exception):
                    raise call
                grades[i] = GradeFailure("model_grader_server_error", f"{leaf.model}: {call}")
                continue
            answer, used = call
            tokens += used
            try:
                grades[i] = parse_model_answer(leaf, answer)
            except GradeFailure as failure:
                grades[i] = failure
        return ModelGrades(grades, tokens, leaf.model)

    @staticmethod
    def _generation(leaf: ModelLeaf, judge: Any) -> Any:
        """The leaf's sampling_params over the judge entry's generation settings."""
        from reward_server.engines._judge import Generation

        spec = judge.spec
        params = getattr(leaf, "sampling_params", None)
        temperature = params.temperature if params and params.temperature is not None else None
        return Generation(
            max_new_tokens=(params and params.max_completions_tokens) or spec.max_new_tokens,
            temperature=spec.temperature if temperature is None else temperature,
            top_p=(params and params.top_p) or spec.top_p,
            seed=params.seed if params else None,
        )

    @staticmethod
    def _rows(
        judge: Any, chats: list[list[dict[str, str]]], generation: Any
    ) -> list[GenerationRow]:
        """The chats rendered and tokenized, each cut to leave room for the answer."""
        texts = judge.judge.render_chats(chats)
        room = max(1, judge.judge.max_length - generation.max_new_tokens)
        encoded = judge.judge.encode(texts, truncate=True, max_length=room)
        return [GenerationRow(e.input_ids, generation) for e in encoded]
