"""Requests to a test's server and the checks every answer gets.

``target`` is a started server (:class:`reward_server.launcher.ServerProcess`: a failed
check then shows the end of its log), a base URL, or a client whose base URL is the
server's (Starlette's ``TestClient`` of an in-process app).
"""

from __future__ import annotations

from typing import Any

import httpx

from reward_server.launcher import ServerProcess

#: A client: anything with httpx.Client's ``post`` (Starlette's ``TestClient``).
Target = ServerProcess | str | Any

#: Long enough for a busy machine's slowest model; a hang still fails the test.
TIMEOUT_S = 300.0


def url_of(target: ServerProcess | str) -> str:
    return target.url if isinstance(target, ServerProcess) else target.rstrip("/")


def _context(target: Target, response: httpx.Response) -> str:
    """What a failed check shows: the answer, and the end of the server's log."""
    if isinstance(target, ServerProcess):
        return f"{response.text}\n{target.log()[-4000:]}"
    return response.text


def post(
    target: Target,
    path: str,
    body: Any,
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
    timeout: float = TIMEOUT_S,
) -> Any:
    """POST ``body`` as JSON to ``path``; the answer must have ``status``; returns its JSON."""
    if isinstance(target, ServerProcess | str):
        url = f"{url_of(target)}{path}"
        response = httpx.post(url, json=body, headers=headers, timeout=timeout)
    else:  # a client (TestClient's base class is Starlette's httpx, not always this one)
        response = target.post(path, json=body, headers=headers, timeout=timeout)
    assert response.status_code == status, _context(target, response)
    return response.json()


def score(target: Target, **body: Any) -> dict[str, Any]:
    """POST /score with ``body``; the answer must be a 200; returns its JSON."""
    return dict(post(target, "/score", body))


def scores(target: Target, **body: Any) -> list[Any]:
    """The ``scores`` of :func:`score`."""
    return list(score(target, **body)["scores"])


def bearer(key: str) -> dict[str, str]:
    """The header of an API key."""
    return {"Authorization": f"Bearer {key}"}


def assert_error(response: httpx.Response, status: int, kind: str) -> dict[str, str]:
    """The response is a JSON error of ``status`` and ``kind``; returns the body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "type"}, body
    assert body["type"] == kind, body
    assert body["error"]
    assert "Traceback" not in body["error"]
    return body
