"""The ``reward-server`` command line: flags, environment, load failures, errors, SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from server_proc import REWARD_SERVER, running_server

from reward_server.cli import build_parser, parse_settings
from reward_server.config import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, ServerSettings
from tiny_models import make_corpus


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No REWARD_SERVER_* variables from the outer environment."""
    import os

    for name in list(os.environ):
        if name.startswith("REWARD_SERVER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_every_settings_field_is_a_flag_with_help() -> None:
    parser = build_parser()
    help_text = parser.format_help()
    options = {a.dest: a for a in parser._actions}
    for name, field in ServerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in help_text, flag
        assert f"REWARD_SERVER_{name.upper()}" in help_text
        assert options[name].help and field.description
    for flag in (
        "--model --adapter --merge-adapter --host --port --dtype --device --max-length "
        "--truncation-side --no-truncate --label-index --chat-template --max-batch-tokens "
        "--max-batch-size --max-wait-ms --max-client-batch --max-queue --max-body-bytes "
        "--api-key --trust-remote-code --log-level"
    ).split():
        assert flag in help_text, flag
    assert "default: 127.0.0.1" in help_text  # defaults are shown


def test_flags_override_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("REWARD_SERVER_MODEL", "from-env")
    clean_env.setenv("REWARD_SERVER_PORT", "9001")
    clean_env.setenv("REWARD_SERVER_NO_TRUNCATE", "true")
    clean_env.setenv("REWARD_SERVER_MAX_WAIT_MS", "7.5")
    s = parse_settings(["--port", "9002", "--dtype", "float32"])
    assert s.model == "from-env"
    assert s.port == 9002  # flag beats env
    assert s.no_truncate is True and s.max_wait_ms == 7.5  # env fills the rest
    assert s.dtype == "float32"
    assert s.host == "127.0.0.1" and s.max_batch_tokens is None  # defaults (per device)
    s = parse_settings(["--model", "m", "--api-key", "hidden-key-42", "--merge-adapter"])
    assert s.model == "m" and s.api_key is not None and s.merge_adapter is True
    assert "hidden-key-42" not in repr(s) and "hidden-key-42" not in str(s)


def test_batch_token_budget_defaults_per_device() -> None:
    s = ServerSettings(model="m")
    assert s.batch_token_budget("cpu", 512) == CPU_BATCH_TOKENS
    assert s.batch_token_budget("cuda:0", 512) == GPU_BATCH_TOKENS
    assert CPU_BATCH_TOKENS < GPU_BATCH_TOKENS
    # never below the model's max length, so one text of the longest kind fits a pass
    assert s.batch_token_budget("cpu", 32768) == 32768
    # a given value wins on any device, even under max_length (the server warns then)
    given = ServerSettings(model="m", max_batch_tokens=300)
    assert given.batch_token_budget("cpu", 512) == given.batch_token_budget("cuda", 512) == 300


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "--model is required"),
        (["--model", "m", "--dtype", "float8"], "invalid choice"),
        (["--model", "m", "--device", "tpu"], "--device"),
        (["--model", "m", "--max-batch-size", "0"], "--max-batch-size"),
        (["--model", "m", "--port", "x"], "invalid int value"),
    ],
)
def test_bad_flags_are_usage_errors(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(argv)
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


def test_python_dash_m_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "reward_server", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("reward-server ")


def _custom_code_model(folder: Path) -> Path:
    """A model folder whose config names code of its own (auto_map), like many hub models."""
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "custom-x",
                "architectures": ["XForSequenceClassification"],
                "auto_map": {"AutoConfig": "cfg.XConfig"},
            }
        )
    )
    (folder / "cfg.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        "class XConfig(PretrainedConfig):\n    model_type = 'custom-x'\n"
    )
    return folder


@pytest.mark.parametrize("case", ["not a model", "bad adapter", "needs its own code"])
def test_model_load_failure_is_one_line_and_nonzero(
    case: str, tmp_path: Path, gpt2_rm: Path
) -> None:
    args = {
        "not a model": ["--model", str(tmp_path)],
        "bad adapter": ["--model", str(gpt2_rm), "--adapter", str(tmp_path / "no-adapter")],
        "needs its own code": ["--model", str(tmp_path / "custom")],
    }[case]
    if case == "needs its own code":
        _custom_code_model(tmp_path / "custom")
    out = subprocess.run(
        [str(REWARD_SERVER), *args, "--port", "1", "--log-level", "warning"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("reward-server: error:")]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"reward-server: error: could not load model {args[1]}: ")
    assert len(lines[0]) > len("reward-server: error: could not load model : ") + len(args[1])
    # transformers asks for trust_remote_code=True; the line names the flag that does it
    assert ("--trust-remote-code" in lines[0]) is (case == "needs its own code")


# --------------------------------------------------------------------------- a configured server

KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def strict_server(gpt2_rm: Path):
    """A GPT-2 server configured only through REWARD_SERVER_* variables."""
    env = {
        "REWARD_SERVER_API_KEY": KEY,
        "REWARD_SERVER_MAX_CLIENT_BATCH": "4",
        "REWARD_SERVER_NO_TRUNCATE": "1",
        "REWARD_SERVER_MAX_LENGTH": "16",
        "REWARD_SERVER_MAX_BODY_BYTES": "4096",
        "REWARD_SERVER_LOG_LEVEL": "debug",
    }
    with running_server(gpt2_rm, env=env) as server:
        yield server


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_environment_configures_the_server(strict_server) -> None:
    info = httpx.get(f"{strict_server.url}/info", headers=AUTH)
    assert info.status_code == 200, info.text
    body = info.json()
    assert body["max_client_batch"] == 4
    assert body["max_length"] == 16
    assert body["truncate"] is False
    assert body["max_body_bytes"] == 4096
    assert body["auth"] is True
    assert KEY not in info.text


def test_auth_over_http(strict_server) -> None:
    url = strict_server.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(f"{url}/score", json={"texts": ["a"]}, headers=headers)
        assert r.status_code == 401 and r.json()["type"] == "unauthorized"
        assert httpx.get(f"{url}/info", headers=headers).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 200
    assert httpx.post(f"{url}/score", json={"texts": ["a"]}, headers=AUTH).status_code == 200
    assert KEY not in strict_server.log()


ERROR_CASES = [
    ("not exactly one form", {"json": {"texts": ["a"], "conversations": [[]]}}, 422, "invalid_request"),
    ("no form", {"json": {}}, 422, "invalid_request"),
    ("unequal lengths", {"json": {"queries": ["a", "b"], "responses": ["c"]}}, 422, "invalid_request"),
    ("empty list", {"json": {"texts": []}}, 422, "invalid_request"),
    ("non-string", {"json": {"texts": [1.5]}}, 422, "invalid_request"),
    ("bad message", {"json": {"conversations": [[{"role": 1, "content": "x"}]]}}, 422, "invalid_request"),
    ("no chat template", {"json": {"conversations": [[{"role": "user", "content": "x"}]]}}, 422, "chat_template"),
    ("invalid json", {"content": b"{", "headers": {"content-type": "application/json"}}, 422, "invalid_request"),
    ("invalid utf-8", {"content": b'{"texts":["\xc3\x28"]}', "headers": {"content-type": "application/json"}}, 422, "invalid_request"),
    ("too many items", {"json": {"texts": ["a"] * 5}}, 413, "too_many_items"),
    ("text too long", {"json": {"texts": ["ok", "word " * 40]}}, 413, "text_too_long"),
    ("body too large", {"json": {"texts": ["a" * 5000]}}, 413, "body_too_large"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "request_kwargs", "status", "kind"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES]
)
def test_error_cases_over_http(strict_server, case, request_kwargs, status, kind) -> None:  # type: ignore[no-untyped-def]
    headers = {**AUTH, **request_kwargs.pop("headers", {})}
    r = httpx.post(f"{strict_server.url}/score", headers=headers, **request_kwargs)
    assert r.status_code == status, r.text
    assert r.json().keys() == {"error", "type"} and r.json()["type"] == kind
    if kind == "text_too_long":
        assert "item 1" in r.json()["error"]
    ok = httpx.post(f"{strict_server.url}/score", json={"texts": ["still up"]}, headers=AUTH)
    assert ok.status_code == 200


def test_streamed_body_over_the_limit_is_413(strict_server) -> None:
    def chunks():  # no Content-Length: the server must count what streams in
        yield b'{"texts": ["'
        for _ in range(100):
            yield b"a" * 100
        yield b'"]}'

    r = httpx.post(
        f"{strict_server.url}/score",
        content=chunks(),
        headers={**AUTH, "content-type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["type"] == "body_too_large"
    assert (
        httpx.post(f"{strict_server.url}/score", json={"texts": ["x"]}, headers=AUTH).status_code
        == 200
    )


def test_404_405_are_json(strict_server) -> None:
    r = httpx.get(f"{strict_server.url}/nowhere")
    assert r.status_code == 404 and r.json()["type"] == "not_found"
    r = httpx.put(f"{strict_server.url}/score", headers=AUTH)
    assert r.status_code == 405 and r.json()["type"] == "method_not_allowed"


# --------------------------------------------------------------------------- SIGTERM


def _in_progress(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(
        r'^reward_server_requests_in_progress\{endpoint="/score"\} (\S+)$', text, re.M
    )
    return float(match.group(1)) if match else 0.0


def test_sigterm_finishes_requests_in_flight_and_exits_zero(gpt2_rm: Path) -> None:
    n_requests = 6
    corpus = make_corpus(n_requests * 5, seed=3, min_words=20, max_words=60)
    chunks = [corpus[i * 5 : (i + 1) * 5] for i in range(n_requests)]
    # The batch is never full (30 rows < 64, and far under the token budget), so the batcher
    # holds every item until --max-wait-ms after the first one arrived: the requests are
    # certainly in flight when SIGTERM comes, and finish only afterwards.
    args = ("--max-batch-size", "64", "--max-batch-tokens", "65536", "--max-wait-ms", "2500")
    with running_server(gpt2_rm, *args) as server:
        done_at: list[float] = []

        def post(texts: list[str]) -> httpx.Response:
            with httpx.Client(timeout=120) as http:
                r = http.post(f"{server.url}/score", json={"texts": texts})
            done_at.append(time.monotonic())
            return r

        with ThreadPoolExecutor(n_requests) as pool:
            futures = [pool.submit(post, chunk) for chunk in chunks]
            while _in_progress(server.url) < n_requests:
                assert not any(f.done() for f in futures), [
                    f.result().text for f in futures if f.done()
                ]
            sigterm_at = time.monotonic()
            code = server.stop(signal.SIGTERM, timeout=120)
            answers = [f.result() for f in futures]
        log = server.log()
    assert code == 0, log
    assert min(done_at) > sigterm_at  # every request was in flight at SIGTERM
    for texts, r in zip(chunks, answers, strict=True):
        assert r.status_code == 200, r.text
        assert len(r.json()["scores"]) == len(texts)
    assert "draining" in log
