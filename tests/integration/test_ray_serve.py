"""The reward server on Ray Serve: a local Ray instance on this CPU, two replicas of a tiny
model, the same answers as the plain server, and no request lost when a replica dies."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from server_proc import free_port, require_counterpart
from starlette.testclient import TestClient

from reward_client import RewardClient
from reward_server.config import ServerSettings
from reward_server.http.app import create_app
from tiny_models import make_corpus

require_counterpart(
    importlib.util.find_spec("ray") is not None,
    "REWARD_SERVER_TEST_RAY",
    "Ray Serve (the extra remote-reward[ray])",
)
import ray  # noqa: E402
from ray import serve  # noqa: E402

from reward_server.http.ray_serve import (  # noqa: E402 - needs Ray: checked above
    DEPLOYMENT_NAME,
    ServeOptions,
    app,
    build,
    deployment_options,
)

REPO = Path(__file__).resolve().parents[2]
APP_NAME = "reward"


@pytest.fixture(scope="module")
def served(bert_rm: Path) -> Iterator[str]:
    """The tiny BERT reward model on two Serve replicas of a local Ray instance; its URL."""
    # Replicas are processes Ray starts: they import this checkout, as the test does.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), saved) if p)
    temp_dir = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit 107 bytes
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024**2,
        _temp_dir=temp_dir,
        log_to_driver=False,
    )
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        options = ServeOptions(num_replicas=2, num_cpus=0.5)
        serve.run(build(ServerSettings(model=str(bert_rm)), options), name=APP_NAME)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def plain(bert_rm: Path) -> Iterator[TestClient]:
    """The same model on the plain app, in process."""
    with TestClient(create_app(ServerSettings(model=str(bert_rm)))) as client:
        yield client


def test_builder_options() -> None:
    settings = ServerSettings(model="m", device="cuda", tensor_parallel_size=2)
    autoscaled = deployment_options(settings, ServeOptions(min_replicas=2, max_replicas=8))
    assert autoscaled["name"] == DEPLOYMENT_NAME
    assert autoscaled["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 2.0}
    assert autoscaled["autoscaling_config"]["target_ongoing_requests"] == 8.0
    assert (
        autoscaled["autoscaling_config"]["min_replicas"],
        autoscaled["max_ongoing_requests"],
    ) == (
        2,
        64,
    )
    fixed = deployment_options(
        ServerSettings(model="m", device="cpu"), ServeOptions(num_replicas=3)
    )
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"]["num_gpus"] == 0.0
    # device auto before Ray is connected (as serve run builds): this machine's GPUs.
    auto = ServerSettings(model="m")
    if not ray.is_initialized():
        gpus = 1.0 if torch.cuda.is_available() else 0.0
        assert deployment_options(auto, ServeOptions())["ray_actor_options"]["num_gpus"] == gpus
    one = deployment_options(auto, ServeOptions(num_gpus=1))
    assert one["ray_actor_options"]["num_gpus"] == 1.0
    with pytest.raises(ValueError, match="bad arguments"):
        app({"model": "m", "min_replicas": "5", "max_replicas": "2"})
    with pytest.raises(ValueError, match="bad arguments"):
        app({"model": "m", "no_such_flag": "1"})


def test_config_file_is_valid_and_builds() -> None:
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load((REPO / "deploy/ray/serve_config.yaml").read_text())
    application = ServeDeploySchema.model_validate(config).applications[0]
    module, _, name = application.import_path.partition(":")
    builder = getattr(importlib.import_module(module), name)
    assert builder is app
    built = builder({**application.args, "model": "/models/x"})
    assert isinstance(built, serve.Application)
    assert application.deployments[0].name == DEPLOYMENT_NAME


def test_scores_and_errors_match_the_plain_server(served: str, plain: TestClient) -> None:
    texts = make_corpus(20, seed=5)
    pairs = {"queries": texts[:5], "responses": texts[5:10]}
    with httpx.Client(base_url=served, timeout=60) as http:
        for body in ({"texts": texts}, pairs):
            got, want = http.post("/score", json=body), plain.post("/score", json=body)
            assert got.status_code == want.status_code == 200
            assert got.json()["scores"] == pytest.approx(want.json()["scores"], abs=1e-6)
            assert got.json()["tokens"] == want.json()["tokens"]
        assert http.get("/health").json() == plain.get("/health").json()
        assert http.get("/info").json()["max_client_batch"] == 256
        for bad in ({"texts": []}, {"texts": ["x"], "queries": ["y"]}, {"texts": ["x"] * 257}):
            got, want = http.post("/score", json=bad), plain.post("/score", json=bad)
            assert (got.status_code, got.json()) == (want.status_code, want.json())
        assert "reward_server_items_total" in http.get("/metrics").text


def replica_actors() -> list[str]:
    """Names of the Serve replica actors of the reward deployment."""
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA") and DEPLOYMENT_NAME in a["name"]
    ]


def running_replicas() -> int:
    status = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME]
    return int(status.replica_states.get("RUNNING", 0))


def test_killing_a_replica_under_load_loses_no_request(served: str, plain: TestClient) -> None:
    texts = make_corpus(12, seed=9)
    expected = plain.post("/score", json={"texts": texts}).json()["scores"]
    results: list[list[float]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    # A request the proxy had sent to the replica as it died fails (500) or, rarely, hangs
    # until the client's timeout: both are retried.
    client = RewardClient(
        served, max_client_batch=3, max_concurrency=4, timeout=20, retry_timeout=90
    )

    # Once the replica is killed, each thread waits a little between its requests: requests
    # still arrive all through the replacement, and the new replica (a worker importing torch)
    # gets the CPU the load would otherwise take from it on a 2-core machine.
    paced = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                results.append(client.score(texts=texts))
            except BaseException as exc:
                errors.append(exc)
                return
            if paced.is_set():
                stop.wait(0.2)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(3)]
    with client:
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + 60
            while len(results) < 10 and not errors and time.monotonic() < deadline:
                time.sleep(0.1)
            names = replica_actors()
            assert len(names) == 2, names
            ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
            killed_at = len(results)
            paced.set()
            # Serve notices, starts another replica, and the load goes on meanwhile. The
            # deadline only bounds a hang: a replica's start (a fresh worker importing torch
            # and loading the model) is slow on a machine busy with other tests.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not errors:
                replaced = set(replica_actors()) - set(names)
                if replaced and running_replicas() == 2:
                    break
                time.sleep(0.5)
            assert replaced and running_replicas() == 2
            count = len(results)
            while len(results) < count + 10 and not errors and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
    assert not errors, errors[:3]
    assert len(results) > killed_at + 10
    for scores in results:
        assert scores == pytest.approx(expected, abs=1e-6)
