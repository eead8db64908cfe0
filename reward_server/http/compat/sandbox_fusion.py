"""SandboxFusion's ``POST /run_code`` on this server, field for field, so that verl's
``sandbox_fusion`` reward (``sandbox_fusion.url: http://HOST:PORT/run_code``) and other
SandboxFusion clients run programs here unchanged.

The request: ``code``, ``language`` (SandboxFusion's names: ``python``, ``cpp``, ``nodejs``;
this server's aliases too), ``stdin``, ``compile_timeout`` and ``run_timeout`` (seconds,
default 10), ``memory_limit_MB`` (-1: the server's limit), ``files`` (name -> base64
content, written beside the program) and ``fetch_files``. The answer: ``status``
(``Success`` when everything finished with exit code 0, ``Failed`` when the program did not
compile, exited with an error or ran out of time, ``SandboxError`` when the sandbox could
not run it), ``message``, ``compile_result`` (compiled languages only) and ``run_result``
(``status`` ``Finished``, ``TimeLimitExceeded`` or ``Error``, ``execution_time``,
``return_code``: the exit code, or minus the signal that ended the program, ``stdout``,
``stderr``), ``executor_pod_name`` (``$MY_POD_NAME``, as SandboxFusion) and ``files``.

What differs: programs run in the sandbox of the server's code verifier (its languages, its
limits as ceilings, see :mod:`reward_server.scoring.code_runs`), behind the server's API
keys and queue limits (401, 429); a language the server does not run, or a file outside
the work directory, is a 422; without a code verifier the route answers 404. A program that
goes past its memory or output limit is ended (``Finished`` with its non-zero return code,
``Failed``) and ``message`` says which limit. ``fetch_files`` is accepted and nothing is
fetched: ``files`` is always empty (the sandbox's work directory is gone after the run).
"""

from __future__ import annotations

import base64
import binascii
import os
from enum import Enum
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from reward_server.errors import RunRefusedError
from reward_server.http.auth import Authorized
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.json_types import Integer, Number
from reward_server.http.schemas import ErrorResponse
from reward_server.http.scoring import run_code as run_in_sandbox
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.code_runs import CodeRun, CodeRunResult

if TYPE_CHECKING:
    from reward_server.sandbox import CompileResult, RunResult

__all__ = [
    "CommandRunResult",
    "CommandRunStatus",
    "RunCodeRequest",
    "RunCodeResponse",
    "RunStatus",
    "router",
]

router = APIRouter(route_class=StrictJSONRoute, tags=["SandboxFusion"])

#: What ``message`` says of a run ended by one of the sandbox's limits.
_LIMIT_MESSAGES = {
    "memory_exceeded": "memory limit exceeded ({memory_mb} MiB)",
    "output_exceeded": "output limit exceeded ({output_bytes} bytes)",
}


class RunCodeRequest(BaseModel):
    """SandboxFusion's ``RunCodeRequest``."""

    model_config = ConfigDict(extra="ignore")

    compile_timeout: Number = Field(10, description="compile timeout for compiled languages")
    run_timeout: Number = Field(10, description="code run timeout")
    memory_limit_MB: Integer = Field(-1, description="maximum memory allowed in megabytes")
    code: str = Field(..., examples=["print(int(input()) * 2)"], description="the code to run")
    stdin: str | None = Field(None, examples=[""], description="optional string to pass into stdin")
    language: str = Field(
        ...,
        examples=["python"],
        description="the language to run the code in: python, cpp, nodejs (SandboxFusion's "
        "names; javascript and other aliases too), among the server's code verifier's",
    )
    files: dict[str, str | None] = Field(
        {},
        description="a dict from file path to base64 encoded file content",
        json_schema_extra={
            "additionalProperties": {
                "anyOf": [
                    {"type": "string", "contentEncoding": "base64", "format": "byte"},
                    {"type": "null"},
                ]
            }
        },
    )
    fetch_files: list[str] = Field(
        [],
        description="a list of file paths to fetch after code execution (accepted; this "
        "server fetches none)",
    )


class RunStatus(str, Enum):
    """The request's outcome."""

    Success = "Success"  # everything finished with exit code 0
    Failed = "Failed"  # a non-zero exit code, or a time limit
    SandboxError = "SandboxError"  # the sandbox could not run it


class CommandRunStatus(str, Enum):
    """One command's outcome."""

    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    """SandboxFusion's ``CommandRunResult``: one command (the compilation, or the run)."""

    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """SandboxFusion's ``RunCodeResponse``."""

    status: RunStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


def _return_code(exit_code: int | None, signal: int | None) -> int | None:
    """The exit code, or minus the signal, as Python's subprocess (and SandboxFusion) say."""
    if exit_code is not None:
        return exit_code
    return -signal if signal is not None else None


#: SandboxFusion's status of a command by the sandbox's (any other: Finished).
_COMMAND_STATUS = {
    "timeout": CommandRunStatus.TimeLimitExceeded,
    "sandbox_error": CommandRunStatus.Error,
}


def _command(result: CompileResult | RunResult) -> CommandRunResult:
    """A build's or a run's result as SandboxFusion's ``CommandRunResult``: a finished
    command has a return code (its exit code, or minus its signal); a sandbox error says
    why in ``stderr``."""
    status = _COMMAND_STATUS.get(result.status, CommandRunStatus.Finished)
    code = None
    if status is CommandRunStatus.Finished:
        code = _return_code(result.exit_code, getattr(result, "signal", None))
        if code is None:
            code = 0 if result.status == "ok" else 1
    stderr = result.stderr
    if status is CommandRunStatus.Error:
        stderr = getattr(result, "message", "") or stderr
    return CommandRunResult(
        status=status,
        execution_time=result.elapsed_s,
        return_code=code,
        stdout=result.stdout,
        stderr=stderr,
    )


def run_code_response(result: CodeRunResult) -> RunCodeResponse:
    """The answer to a run, with SandboxFusion's rules for its status."""
    compiled = None if result.compile is None else _command(result.compile)
    ran = None if result.run is None else _command(result.run)
    commands = [c for c in (compiled, ran) if c is not None]
    message = ""
    errors = [c for c in commands if c.status is CommandRunStatus.Error]
    if errors:
        status = RunStatus.SandboxError
        message = errors[0].stderr or "the sandbox could not run the program"
    elif any(
        c.status is CommandRunStatus.TimeLimitExceeded or c.return_code != 0 for c in commands
    ):
        status = RunStatus.Failed
        if result.run is not None and result.run.status in _LIMIT_MESSAGES:
            limits = result.limits
            message = _LIMIT_MESSAGES[result.run.status].format(
                memory_mb=limits.memory_mb, output_bytes=limits.output_bytes
            )
    else:
        status = RunStatus.Success
    return RunCodeResponse(
        status=status,
        message=message,
        compile_result=compiled,
        run_result=ran,
        executor_pod_name=os.environ.get("MY_POD_NAME"),
        files={},
    )


def _decoded(files: dict[str, str | None]) -> dict[str, bytes]:
    """The request's files as bytes (a None content is skipped, as SandboxFusion does)."""
    out = {}
    for name, content in files.items():
        if content is None:
            continue
        try:
            out[name] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise RunRefusedError(f"files: {name!r} is not base64") from None
    return out


#: /run_code's error answers: the scoring routes' but for what a run cannot meet, and 404 on a
#: server without code rewards.
RUN_CODE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERROR_DOCS,
    404: {"model": ErrorResponse, "description": "No verifier: code entry on this server"},
    413: {**ERROR_DOCS[413], "description": "A body over --max-body-bytes (body_too_large)"},
    422: {
        **ERROR_DOCS[422],
        "description": "Malformed input (invalid_request): a body this schema refuses, a string "
        "that is not Unicode text (a lone surrogate escape); a language the server's code "
        "verifier does not run, a file that is not base64 or not a path inside the work "
        "directory (run_refused)",
    },
}


@router.post("/run_code", response_model=RunCodeResponse, responses=RUN_CODE_ERRORS)
async def run_code(body: RunCodeRequest, request: Request, _auth: Authorized) -> RunCodeResponse:
    """Run one program in the sandbox, as SandboxFusion's /run_code does."""
    run = CodeRun(
        code=body.code,
        language=body.language,
        files=_decoded(body.files),
        stdin=body.stdin,
        compile_timeout_s=body.compile_timeout,
        run_timeout_s=body.run_timeout,
        memory_mb=body.memory_limit_MB,
    )
    result = await run_in_sandbox(request, run)
    return run_code_response(result)
