"""``kind: verifier`` entries of the models file, one class per verifier: a rule instead of a
model (no ``model`` key). ``math``, ``exact``, ``regex``, ``python``, ``tool_call`` and
``format`` run in a pool of worker processes (:class:`PooledVerifier`: ``workers``); ``code``
runs the response's program against the item's tests in a sandbox
(:class:`CodeVerifierEntry`: its tests share ``parallel_tests`` sandbox slots).

``timeout_s`` means one thing in every verifier: the seconds one item may take (a code item:
its compilation and all its tests); ``on_error`` what an item whose verification failed gets.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from reward_server.config.entries import _Fallible, two_tags

__all__ = [
    "CodeSandbox",
    "CodeScore",
    "CodeVerifierEntry",
    "ExactVerifier",
    "FormatVerifier",
    "MathVerifier",
    "PooledVerifier",
    "PythonVerifier",
    "RegexVerifier",
    "ToolCallVerifier",
    "VerifierEntry",
]

#: How a code verifier scores an item: the share of its tests passed, or 1 when all passed.
CodeScore = Literal["pass_rate", "all_pass"]
#: Where untrusted code runs: a bubblewrap sandbox, or unsandboxed (trusted code only).
CodeSandbox = Literal["bwrap", "none"]


class VerifierEntry(_Fallible):
    """What every verifier has."""

    kind: Literal["verifier"] = "verifier"
    #: The rule (each class fixes its own).
    verifier: str

    timeout_s: float = Field(default=5.0, gt=0, le=3600)
    """Seconds one item may take (default 5; verifier: code 60: its compilation and all its tests, after which its remaining tests are timeouts)."""


class PooledVerifier(VerifierEntry):
    """A verifier whose items run in a pool of worker processes."""

    workers: int = Field(default=1, ge=1, le=256)
    """Worker processes verifying items at once."""


class MathVerifier(PooledVerifier):
    """``verifier: math``: the response's final answer equals the label's by math-verify."""

    verifier: Literal["math"]
    SELECTOR: ClassVar[str] = "verifier: math"


class ExactVerifier(PooledVerifier):
    """``verifier: exact``: the final answer (or the stripped response) equals the label."""

    verifier: Literal["exact"]
    SELECTOR: ClassVar[str] = "verifier: exact"


class RegexVerifier(PooledVerifier):
    """``verifier: regex``: the response matches a regular expression."""

    verifier: Literal["regex"]
    SELECTOR: ClassVar[str] = "verifier: regex"

    pattern: str | None = Field(default=None, min_length=1)
    """The regular expression searched in the response (default: each item's label)."""


class _Sandboxed(VerifierEntry):
    """Keys of a verifier that runs untrusted code in a bubblewrap sandbox."""

    memory_mb: int = Field(default=1024, ge=16, le=1 << 20)
    """The sandboxed process's memory limit (address space), in MiB."""
    bwrap: str | None = Field(default=None, min_length=1)
    """The bwrap binary to use (default: the one the server extra installs, else bwrap on PATH)."""


class PythonVerifier(PooledVerifier, _Sandboxed):
    """``verifier: python``: a user's function ``f(prompt, response, label)``."""

    verifier: Literal["python"]
    SELECTOR: ClassVar[str] = "verifier: python"

    function: str | None = Field(default=None, pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_]*$")
    """module:function or path/to/file.py:function, called as f(prompt, response, label) (with tools= and tool_calls= when it names them)."""
    sandbox: CodeSandbox = "none"
    """none (the default: the function runs in the worker processes, with the server's rights) or bwrap (each item's call in a sandbox of its own, seeing Python's standard library and the function's own file only; the server does not start where none can be made, or where the function does not import there)."""

    @model_validator(mode="after")
    def _callable(self) -> PythonVerifier:
        if self.function is None:
            raise ValueError("verifier: python needs 'function' (module:function)")
        given = self.model_fields_set
        if self.sandbox == "none" and given & {"bwrap", "memory_mb"}:
            keys = ", ".join(sorted(given & {"bwrap", "memory_mb"}))
            raise ValueError(f"{keys}: for verifier: python only with sandbox: bwrap")
        return self


class CodeVerifierEntry(_Sandboxed):
    """``verifier: code``: the response's last fenced program run against the item's tests (its
    label), every program in a sandbox."""

    verifier: Literal["code"]
    SELECTOR: ClassVar[str] = "verifier: code"
    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {
        "workers": ("parallel_tests", "tests run at once over all items")
    }

    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Seconds one item may take: its compilation and all its tests, after which its remaining tests are timeouts."""
    parallel_tests: int | None = Field(default=None, ge=1, le=256)
    """Tests run at once, over all items (default: the machine's cores)."""
    languages: list[str] = Field(default=["python"], min_length=1)
    """The languages a program may be in (python, cpp, javascript; aliases such as py, c++, js); a fenced block's language tag picks one, the first is for a block without a tag."""
    score: CodeScore = "pass_rate"
    """pass_rate (the share of the item's tests passed) or all_pass (1 when every test passed, else 0)."""
    stop_on_failure: bool = False
    """After an item's first failed test start none of its others (they are skipped, and count as failed)."""
    test_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """Seconds one test may run (wall clock)."""
    output_bytes: int = Field(default=1 << 20, ge=1024)
    """Most bytes kept of a test's stdout (and of its stderr); a program that writes more is stopped: output_exceeded."""
    float_tolerance: float | None = Field(default=None, ge=0)
    """Numbers in an answer match the expected ones within this tolerance, absolute or relative (default: exact)."""
    sandbox: CodeSandbox = "bwrap"
    """bwrap (the default: every program in a bubblewrap sandbox; the server does not start where none can be made) or none (unsandboxed: trusted programs only, warned at every start)."""

    @model_validator(mode="after")
    def _bwrap_with_sandbox(self) -> CodeVerifierEntry:
        if self.bwrap is not None and self.sandbox == "none":
            raise ValueError("bwrap: not with sandbox: none (it runs no sandbox)")
        return self


class ToolCallVerifier(PooledVerifier):
    """``verifier: tool_call``: the response's tool calls against the label's expected calls
    (the Berkeley Function Calling Leaderboard's rules)."""

    verifier: Literal["tool_call"]
    SELECTOR: ClassVar[str] = "verifier: tool_call"

    tool_call_tags: tuple[str, str] | None = ("<tool_call>", "</tool_call>")
    """The tags around a call written in the response's text (read when the response message has no tool_calls); null: only tool_calls count."""
    credit: Literal["all", "partial"] = "all"
    """all (1 when every expected call is made right, else 0) or partial (matched / max(expected, made); see the agents guide)."""
    calls: Literal["response", "trajectory"] = "response"
    """The calls checked: the response message's (response), or every assistant message's after the last user message, in order (trajectory)."""
    check_schema: bool = True
    """Check each call's arguments against its tool's JSON schema (when the item sends tools)."""

    @field_validator("tool_call_tags")
    @classmethod
    def _tags(cls, value: Any, info: ValidationInfo) -> Any:
        return two_tags(value, str(info.field_name))


class FormatVerifier(PooledVerifier):
    """``verifier: format``: the response has the shape a GRPO format reward asks for (it keeps
    the thinking by default: it checks it)."""

    verifier: Literal["format"]
    SELECTOR: ClassVar[str] = "verifier: format"
    KEEPS_REASONING: ClassVar[bool] = True

    answer_tags: tuple[str, str] | None = None
    """The tags the answer must be between (one such block after the thinking); null: no answer tag."""
    require_reasoning: bool = True
    """The response must hold one closed thinking block (reasoning_tags) before its answer."""
    pattern: str | None = Field(default=None, min_length=1)
    """A regular expression searched in the answer."""

    @field_validator("answer_tags")
    @classmethod
    def _tags(cls, value: Any, info: ValidationInfo) -> Any:
        return two_tags(value, str(info.field_name))
