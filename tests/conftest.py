"""Shared fixtures: offline settings and tiny models saved once per test session."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

# No test may reach a hub; set before transformers is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A vLLM engine a test starts takes 1 GiB for its KV cache instead of vLLM's share of the
# machine's memory (several GiB, touched at start-up): the tests' engines need little, and
# those of several pytest workers then fit in memory together.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import functools
import ssl
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx._transports.default as httpx_transports
import pytest
from filelock import FileLock

# tiny_models (torch and transformers: about 6 s of CPU) is imported in the fixtures that
# use it, not here: xdist's controller loads this file too, before it starts its workers,
# and builds no model.


def _share_the_default_ssl_context() -> None:
    """Every httpx client builds an SSL context when it is made, loading certifi's bundle:
    about 25 ms of CPU, for http:// URLs too. The suite makes thousands of clients (each
    ``httpx.get``/``post`` is one, and polls make one ten times a second). Here the context
    of the default settings is built once per set of certificate variables and shared (an
    SSL context may serve many clients, as httpx advises); a client given ``verify`` or
    ``cert`` of its own still builds its own. Only this test process's clients: the servers
    and trainers it starts are untouched."""
    build = httpx_transports.create_ssl_context

    @functools.cache
    def default(trust_env: bool, cafile: str | None, capath: str | None) -> ssl.SSLContext:
        # cafile and capath (SSL_CERT_FILE, SSL_CERT_DIR, which httpx reads) are the cache's
        # key only: a test that sets them gets a context of its own.
        return build(verify=True, cert=None, trust_env=trust_env)

    def shared(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is True and cert is None:
            env = os.environ if trust_env else {}
            return default(trust_env, env.get("SSL_CERT_FILE"), env.get("SSL_CERT_DIR"))
        return build(verify=verify, cert=cert, trust_env=trust_env)

    httpx_transports.create_ssl_context = shared  # type: ignore[assignment]


_share_the_default_ssl_context()

if TYPE_CHECKING:
    from fastapi.testclient import TestClient
    from helpers.servers import SharedServers
    from server_proc import ServerProcess

#: The modules that take longest (half a minute or more in make test's log: trained models,
#: the demo, vLLM servers), started first so that make test's workers do not end with one of
#: them still running a long module alone: xdist's loadfile (with --no-loadscope-reorder)
#: hands whole modules out in collection order, one at a time, to whichever worker is free.
#: test_judge_generate trains the judge test_vllm_judge also serves, so it comes just before.
LONGEST_FIRST = (
    "test_judge_generate.py",
    "test_vllm_judge.py",
    "test_demo.py",
    "test_bench.py",
    "test_reliability_faults.py",
    "test_vllm_pairwise.py",
    "test_ray_serve.py",
    "test_masks_server.py",
    "test_ppo_train_masks.py",
    "test_long_runs.py",
    "test_vllm_server.py",
    "test_tenants_server.py",
    "test_reliability_load.py",
    "test_examples.py",
    "test_trl_grpo.py",
    "test_score_cache_server.py",
    "test_ctrl_c.py",
    "test_reliability_hostile.py",
    "test_docs.py",
    "test_reliability_schemathesis.py",
    "test_grpo_verifier.py",
    "test_remote_component_vllm.py",
    "test_client_sockets.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of LONGEST_FIRST first, in its order; the others after, as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def learning_report() -> Callable[..., None]:
    """``learning_report(name, first=..., last=...)``: one JSON line of a learning test's
    figures in the file ``$LEARNING_REPORT`` names (``make test-learning`` sets it and prints
    the lines per CPU variant); nothing without it."""
    path = os.environ.get("LEARNING_REPORT")

    def report(name: str, **figures: object) -> None:
        if path:
            variant = os.environ.get("LEARNING_VARIANT", "default")
            line = json.dumps({"test": name, "variant": variant, **figures}, default=str)
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return report


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the test (tiny models run fastest so, especially on a
    shared machine); the thread count is restored after."""
    import tiny_models

    with tiny_models.torch_threads(1):
        yield


@pytest.fixture(scope="session")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``built_once(name, build)``: ``build(folder)`` once per ``make test``, shared by its
    pytest workers; returns the folder.

    For a model that takes a while to make (a trained one): the first worker that asks
    builds it under a file lock in the run's base folder, which all xdist workers share;
    the others wait for it and reuse the folder.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # .../pytest-N/popen-gwK -> .../pytest-N, the same for every worker

    def build_or_reuse(name: str, build: Callable[[Path], object]) -> Path:
        folder = root / f"shared-{name}"
        done = folder / ".built"
        with FileLock(str(folder) + ".lock"):
            if not done.exists():
                folder.mkdir(exist_ok=True)
                build(folder)
                done.touch()
        return folder

    return build_or_reuse


@pytest.fixture(scope="session")
def bert_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny BERT encoder reward model (WordPiece tokenizer)."""
    import tiny_models

    return tiny_models.save_bert_reward_model(tmp_path_factory.mktemp("bert_rm"))


@pytest.fixture(scope="session")
def gpt2_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny GPT-2 decoder reward model, pad token == EOS."""
    import tiny_models

    return tiny_models.save_gpt2_reward_model(tmp_path_factory.mktemp("gpt2_rm"))


@pytest.fixture(scope="session")
def llama_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Llama-like decoder reward model with a chat template and no pad token."""
    import tiny_models

    return tiny_models.save_llama_reward_model(tmp_path_factory.mktemp("llama_rm"))


@pytest.fixture(scope="session")
def gpt2_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny GPT-2 causal LM policy with its own byte-level BPE tokenizer."""
    import tiny_models

    return tiny_models.save_gpt2_policy(tmp_path_factory.mktemp("gpt2_policy"))


@pytest.fixture(scope="session")
def judges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random judges (causal LMs whose vocabulary holds "Yes" and "No", with a chat
    template): ``gpt2`` (no BOS) and ``llama`` (a BOS its tokenizer adds)."""
    from helpers.judges import save_judge

    return {f: save_judge(tmp_path_factory.mktemp(f"judge_{f}"), f) for f in ("gpt2", "llama")}


@pytest.fixture(scope="session")
def rubric_judge(built_once: Callable[..., Path]) -> Path:
    """The judge trained to answer a rubric (:mod:`helpers.rubric_judge`), trained once per
    ``make test`` and shared by its workers."""
    from helpers.rubric_judge import train_rubric_judge

    return built_once("rubric-judge", train_rubric_judge)


@pytest.fixture(scope="session")
def grader_judge(built_once: Callable[..., Path]) -> Path:
    """The judge trained to answer OpenAI's score_model graders (:mod:`helpers.grader_judge`),
    trained once per ``make test`` and shared by its workers."""
    from helpers.grader_judge import train_grader_judge

    return built_once("grader-judge", train_grader_judge)


@pytest.fixture(scope="session")
def verl_path() -> str:
    """verl's PYTHONPATH entry (:mod:`helpers.drivers`); skips, or fails under
    REWARD_SERVER_TEST_VERL=1, without verl."""
    from helpers.drivers import require_verl

    return require_verl()


@pytest.fixture(scope="session")
def openrlhf_agent() -> ModuleType:
    """OpenRLHF 0.11.2's own ``openrlhf.utils.agent`` module (:mod:`helpers.openrlhf`)."""
    from helpers.openrlhf import fetch_openrlhf_utils, load_agent_module

    return load_agent_module(fetch_openrlhf_utils())


# ------------------------------------------------------------------ servers by spec


@pytest.fixture(scope="module")
def gpt2_app(gpt2_rm: Path) -> Iterator[TestClient]:
    """An in-process app of ``gpt2_rm`` with the server's defaults, its lifespan started."""
    from fastapi.testclient import TestClient

    from reward_server.config import ServerSettings
    from reward_server.http.app import create_app

    with TestClient(create_app(ServerSettings(model=str(gpt2_rm)))) as client:
        yield client


@pytest.fixture
def models_client(tmp_path: Path) -> Iterator[Callable[..., TestClient]]:
    """``models_client(entries, *, top=None, **settings)``: a ``TestClient`` (its app's
    lifespan started) of an in-process app serving a models file of ``entries`` (and the
    file's keys ``top``), with ``settings``; every one closed after the test."""
    from fastapi.testclient import TestClient
    from helpers.apps import models_app

    clients: list[TestClient] = []

    def start(entries: list[dict[str, Any]], **settings: Any) -> TestClient:
        client = TestClient(models_app(tmp_path, entries, **settings)).__enter__()
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServers]:
    """``with shared_server(model, *flags, models=entries) as server``: the real server of
    that spec, started once for every test and test file of this pytest worker that asks
    for it (:mod:`helpers.servers`: only for tests that leave it as they found it)."""
    from helpers.servers import SharedServers  # the unit tests never start one

    servers = SharedServers(tmp_path_factory.mktemp("shared_servers"))
    yield servers
    servers.close()


@pytest.fixture(scope="module")
def bert_server(shared_server: SharedServers, bert_rm: Path) -> Iterator[ServerProcess]:
    """``reward-server --model bert_rm``, the server's defaults (shared)."""
    with shared_server(bert_rm) as server:
        yield server


@pytest.fixture(scope="module")
def gpt2_server(shared_server: SharedServers, gpt2_rm: Path) -> Iterator[ServerProcess]:
    """``reward-server --model gpt2_rm``, the server's defaults (shared)."""
    with shared_server(gpt2_rm) as server:
        yield server


@pytest.fixture(scope="session")
def tool_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Llama reward model whose chat template renders tool use (agent_models'
    REWARD_TEMPLATE)."""
    from agent_models import REWARD_TEMPLATE

    import tiny_models

    path = tmp_path_factory.mktemp("tool_rm")
    return tiny_models.save_llama_reward_model(path, chat_template=REWARD_TEMPLATE)


@pytest.fixture(scope="module")
def tool_server(shared_server: SharedServers, tool_rm: Path) -> Iterator[ServerProcess]:
    """``reward-server --model tool_rm``, the server's defaults (shared)."""
    with shared_server(tool_rm) as server:
        yield server


@pytest.fixture(scope="module")
def llama_server(shared_server: SharedServers, llama_rm: Path) -> Iterator[ServerProcess]:
    """``reward-server --model llama_rm``, the server's defaults (shared)."""
    with shared_server(llama_rm) as server:
        yield server
