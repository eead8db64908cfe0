"""HTTPS end to end: ``reward-server --ssl-certfile/--ssl-keyfile`` with a certificate from a
test CA (made here with ``cryptography``), the reward client with and without that CA,
``ppo-client score`` and ``ppo-client train`` over TLS, and the server's start-up errors.

The certificate is issued by a CA of its own (not self-signed), as a cluster's cert-manager
or a lab's internal CA would issue it, for ``127.0.0.1`` and ``localhost``.
"""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import math
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.pki import PASSWORD, Pki, make_pki
from helpers.training import (
    PPO_CLIENT,
    PROMPTS,
    TRL_METRICS,
    ppo_client_env,
    read_jsonl,
    write_prompts,
)
from server_proc import REWARD_SERVER, ServerProcess, require_counterpart, running_server

from ppo_client.config import ConfigError, PPOConfig
from ppo_client.reward import default_reward_fn
from reward_client import AsyncRewardClient, RetryEvent, RewardClient, RewardServerError
from reward_client.integrations.settings import ClientSettings
from reward_server.cli import check_tls, parse_settings

API_KEY = "tls-test-key"
TEXTS = ["a great film", "boring", "fine, I suppose"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(bert_rm: Path, pki: Pki) -> Iterator[ServerProcess]:
    """A real reward-server over HTTPS, its certificate given through the environment."""
    env = {
        "REWARD_SERVER_SSL_CERTFILE": str(pki.cert),
        "REWARD_SERVER_SSL_KEYFILE": str(pki.key),
        "REWARD_SERVER_API_KEY": API_KEY,
    }
    trusted = ssl.create_default_context(cafile=str(pki.ca))
    with running_server(bert_rm, "--max-client-batch", "2", env=env, verify=trusted) as srv:
        yield srv


# ----------------------------------------------------------------------------------------
# The server speaks HTTPS; the client checks it.


def test_server_serves_https_only(server: ServerProcess, pki: Pki) -> None:
    """The start-up log says https; the port answers TLS, and plain HTTP gets no answer."""
    assert server.url.startswith("https://")
    assert f"at https://127.0.0.1:{server.port}" in server.log()
    health = httpx.get(f"{server.url}/health", verify=ssl.create_default_context(cafile=pki.ca))
    assert health.status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=10)


def test_container_health_check_probes_https(server: ServerProcess) -> None:
    """docker/healthcheck.py (the image's HEALTHCHECK) follows REWARD_SERVER_SSL_CERTFILE."""
    script = Path(__file__).resolve().parents[2] / "docker" / "healthcheck.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER_")}
    env["REWARD_SERVER_PORT"] = str(server.port)
    plain = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert plain.returncode == 1 and "http://127.0.0.1" in plain.stderr
    env["REWARD_SERVER_SSL_CERTFILE"] = "/etc/reward-server/tls/tls.crt"
    tls = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert tls.returncode == 0, tls.stderr


def test_encrypted_key_serves_with_its_password(bert_rm: Path, pki: Pki) -> None:
    """The password reaches uvicorn: a server with an encrypted key answers over HTTPS."""
    env = {
        "REWARD_SERVER_SSL_CERTFILE": str(pki.cert),
        "REWARD_SERVER_SSL_KEYFILE": str(pki.encrypted_key),
        "REWARD_SERVER_SSL_KEYFILE_PASSWORD": PASSWORD,
    }
    trusted = ssl.create_default_context(cafile=str(pki.ca))
    with (
        running_server(bert_rm, env=env, verify=trusted) as srv,
        RewardClient(srv.url, verify=trusted) as client,
    ):
        assert len(client.score(texts=TEXTS)) == len(TEXTS)
        assert PASSWORD not in srv.log()


def test_client_with_the_ca_bundle_scores(server: ServerProcess, pki: Pki) -> None:
    """A CA bundle path (str or Path) or an SSLContext; the API key travels inside TLS."""
    with RewardClient(server.url, api_key=API_KEY, verify=str(pki.ca)) as client:
        scores = client.score(texts=TEXTS)  # two requests: max_client_batch is 2
        assert client.info()["max_client_batch"] == 2
    assert len(scores) == len(TEXTS) and all(math.isfinite(s) for s in scores)
    with RewardClient(server.url, api_key=API_KEY, verify=pki.ca) as client:
        assert client.score(texts=TEXTS) == scores
    context = ssl.create_default_context(cafile=str(pki.ca))
    with RewardClient(server.url, api_key=API_KEY, verify=context) as client:
        assert client.score(texts=TEXTS) == scores
    # The key is still checked over TLS.
    with (
        RewardClient(server.url, api_key="wrong", verify=pki.ca) as client,
        pytest.raises(RewardServerError) as caught,
    ):
        client.score(texts=TEXTS)
    assert caught.value.status == 401


def test_async_client_with_the_ca_bundle_scores(server: ServerProcess, pki: Pki) -> None:
    with RewardClient(server.url, api_key=API_KEY, verify=pki.ca) as client:
        expected = client.score(texts=TEXTS)

    async def main() -> list[float]:
        async with AsyncRewardClient(server.url, api_key=API_KEY, verify=pki.ca) as client:
            return await client.score(texts=TEXTS)

    assert asyncio.run(main()) == expected


def test_verify_false_skips_the_check(server: ServerProcess) -> None:
    with RewardClient(server.url, api_key=API_KEY, verify=False) as client:
        assert len(client.score(texts=TEXTS)) == len(TEXTS)


def test_untrusted_certificate_fails_at_once(server: ServerProcess) -> None:
    """Without the CA the call fails with a verification error on the first attempt,
    although the retry budget is long: a certificate does not fix itself."""
    retries: list[RetryEvent] = []
    with (
        RewardClient(
            server.url, api_key=API_KEY, retry_timeout=600, on_retry=retries.append
        ) as client,
        pytest.raises(RewardServerError) as caught,
    ):
        client.score(texts=TEXTS)
    error = caught.value
    assert "TLS certificate verification failed" in str(error)
    assert "verify=PATH" in str(error) and "reward_ca_bundle" in str(error)
    assert error.attempts == 1 and error.status is None and retries == []
    assert isinstance(error.__cause__, httpx.ConnectError)


def test_certificate_for_another_name_fails_at_once(server: ServerProcess, pki: Pki) -> None:
    """dns+https:// checks the certificate against the name: localhost is in it, another
    name resolving to the same address is not."""
    addresses = {"localhost": ["127.0.0.1"], "rm.example": ["127.0.0.1"]}

    def resolver(host: str, port: int) -> list[str]:
        return addresses[host]

    with RewardClient(
        f"dns+https://localhost:{server.port}", api_key=API_KEY, verify=pki.ca, resolver=resolver
    ) as client:
        assert len(client.score(texts=TEXTS)) == len(TEXTS)
    with (
        RewardClient(
            f"dns+https://rm.example:{server.port}",
            api_key=API_KEY,
            verify=pki.ca,
            resolver=resolver,
        ) as client,
        pytest.raises(RewardServerError, match="certificate verification failed") as caught,
    ):
        client.score(texts=TEXTS)
    assert caught.value.attempts == 1
    assert "rm.example" in str(caught.value.__cause__)


def test_failover_between_https_urls(server: ServerProcess, pki: Pki) -> None:
    """Several https base URLs: a dead one (connection refused) is retried elsewhere."""
    from server_proc import free_port

    dead = f"https://127.0.0.1:{free_port()}"
    with RewardClient([dead, server.url], api_key=API_KEY, verify=pki.ca) as client:
        assert len(client.score(texts=TEXTS * 2)) == 2 * len(TEXTS)


def test_https_url_to_a_plain_http_port_fails_at_once() -> None:
    """A TLS client on a plain-HTTP port: named as such, not retried."""
    plain = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=plain.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{plain.server_address[1]}"
        with (
            RewardClient(url, retry_timeout=600) as client,
            pytest.raises(RewardServerError, match="does not speak TLS") as caught,
        ):
            client.score(texts=TEXTS)
        assert caught.value.attempts == 1
    finally:
        plain.shutdown()
        plain.server_close()


def test_unreadable_ca_bundle_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot load the CA bundle"):
        RewardClient("https://127.0.0.1:1", verify=tmp_path / "missing.pem")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ValueError, match="cannot load the CA bundle"):
        RewardClient("https://127.0.0.1:1", verify=not_pem)


def test_integrations_take_the_ca_bundle(
    server: ServerProcess, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's and OpenRLHF's settings: REWARD_CA_BUNDLE (or reward_ca_bundle); a verify
    among reward_client_options wins."""
    monkeypatch.setenv("REWARD_CA_BUNDLE", str(pki.ca))
    settings = ClientSettings.read({"reward_url": server.url, "reward_api_key": API_KEY})
    with RewardClient(**settings.client_kwargs()) as client:
        assert len(client.score(texts=TEXTS)) == len(TEXTS)
    monkeypatch.delenv("REWARD_CA_BUNDLE")
    settings = ClientSettings.read({"reward_url": server.url, "reward_ca_bundle": str(pki.ca)})
    assert settings.client_kwargs()["verify"] == str(pki.ca)
    settings = ClientSettings.read(
        {
            "reward_url": server.url,
            "reward_ca_bundle": str(pki.ca),
            "reward_client_options": {"verify": False},
        }
    )
    assert settings.client_kwargs()["verify"] is False


# ----------------------------------------------------------------------------------------
# The PPO trainer's config and CLI.


def test_ppo_config_tls_keys(pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="set one of them"):
        PPOConfig(reward_ca_bundle=str(pki.ca), reward_tls_verify=False)
    with pytest.raises(ConfigError, match="reward_ca_bundle: cannot load"):
        default_reward_fn(
            PPOConfig(reward_url="https://x:1", reward_ca_bundle=str(tmp_path / "none.pem"))
        )
    monkeypatch.setenv("REWARD_CA_BUNDLE", str(pki.ca))
    assert PPOConfig.from_sources(None, {}).reward_ca_bundle == str(pki.ca)


def test_ppo_client_score_over_https(server: ServerProcess, pki: Pki) -> None:
    """--ca-bundle scores; without it the command fails with the verification error."""
    env = {**ppo_client_env(), "REWARD_API_KEY": API_KEY}
    env.pop("REWARD_CA_BUNDLE", None)
    base = [str(PPO_CLIENT), "score", "--reward-url", server.url]
    good = subprocess.run(
        [*base, "--ca-bundle", str(pki.ca), *TEXTS],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert good.returncode == 0, good.stderr
    with RewardClient(server.url, api_key=API_KEY, verify=pki.ca) as client:
        assert [float(x) for x in good.stdout.split()] == pytest.approx(
            client.score(texts=TEXTS), abs=1e-6
        )
    bad = subprocess.run([*base, *TEXTS], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert "certificate verification failed" in bad.stderr


def test_ppo_client_train_over_https(
    server: ServerProcess, pki: Pki, gpt2_policy: Path, tmp_path: Path
) -> None:
    """``ppo-client train`` against the HTTPS server with the CA bundle from its config;
    the logged scores are the server's."""
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:16])
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    config.write_text(
        f"model_name_or_path: {gpt2_policy}\n"
        f"reward_url: {server.url}\n"
        f"reward_ca_bundle: {pki.ca}\n"
        f"dataset_name: {data}\n"
        f"output_dir: {out}\n"
        "per_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 1\n"
        "local_rollout_forward_batch_size: 4\n"
        "total_episodes: 8\n"
        "num_ppo_epochs: 1\n"
        "response_length: 8\n"
        "stop_token: eos\n"
        "num_sample_generations: 2\n"
        "disable_tqdm: true\n"
    )
    env = {**ppo_client_env(), "REWARD_API_KEY": API_KEY}
    env.pop("REWARD_CA_BUNDLE", None)
    proc = subprocess.run(
        [str(PPO_CLIENT), "train", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + server.log()
    assert "done: 2 steps" in proc.stdout
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        # val/ratio_var is NaN with one mini-batch (the variance of one value).
        for key in set(TRL_METRICS) - {"val/ratio_var"}:
            assert math.isfinite(row[key]), (key, row)
    samples = read_jsonl(out / "samples.jsonl")
    assert samples
    with RewardClient(server.url, api_key=API_KEY, verify=pki.ca) as client:
        again = client.score(
            queries=[s["query"] for s in samples], responses=[s["response"] for s in samples]
        )
    assert again == pytest.approx([s["score"] for s in samples], abs=1e-5)


def test_ray_serve_refuses_a_certificate(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve's proxy owns the port: a certificate there would be silently ignored, so the
    application builder says so instead."""
    # Ray is a real counterpart: under make test a missing Ray fails this test, not skips it.
    require_counterpart(
        importlib.util.find_spec("ray") is not None,
        "REWARD_SERVER_TEST_RAY",
        "Ray Serve (the extra remote-reward[ray])",
    )
    from reward_server.http import ray_serve

    for name in [n for n in os.environ if n.startswith("REWARD_SERVER_")]:
        monkeypatch.delenv(name)
    args = {"model": "m", "ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.key)}
    with pytest.raises(ValueError, match="do not apply on Ray Serve"):
        ray_serve.app(args)


# ----------------------------------------------------------------------------------------
# Start-up errors: before the model loads, one line, exit code 2.


def _start(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """reward-server with a model that does not exist: a TLS error must come first."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER_")}
    return subprocess.run(
        [str(REWARD_SERVER), "--model", str(tmp_path / "no-model"), "--port", "1", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=120,
    )


def test_missing_key_file_is_a_start_up_error(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "absent.key"
    proc = _start(tmp_path, "--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(missing))
    assert proc.returncode == 2
    assert f"--ssl-keyfile: cannot read {missing}: No such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr and "loading" not in proc.stderr


def test_certificate_without_key_is_a_start_up_error(pki: Pki, tmp_path: Path) -> None:
    proc = _start(tmp_path, env={"REWARD_SERVER_SSL_CERTFILE": str(pki.cert)})
    assert proc.returncode == 2
    assert "--ssl-certfile needs --ssl-keyfile (or REWARD_SERVER_SSL_KEYFILE)" in proc.stderr
    proc = _start(tmp_path, "--ssl-keyfile", str(pki.key))
    assert proc.returncode == 2
    assert "--ssl-keyfile needs --ssl-certfile" in proc.stderr


def test_key_of_another_certificate_is_a_start_up_error(pki: Pki, tmp_path: Path) -> None:
    proc = _start(tmp_path, "--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.ca_key))
    assert proc.returncode == 2
    assert "not a PEM certificate and its private key" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_encrypted_key_needs_its_password(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """The password unlocks the key; a wrong or missing one is named (never prompted for)."""
    for name in list(os.environ):
        if name.startswith("REWARD_SERVER_"):
            monkeypatch.delenv(name)
    flags = ["--model", "m", "--ssl-certfile", str(pki.cert), "--ssl-keyfile"]
    assert check_tls(parse_settings([*flags, str(pki.key)])) is None
    encrypted = [*flags, str(pki.encrypted_key)]
    monkeypatch.setenv("REWARD_SERVER_SSL_KEYFILE_PASSWORD", PASSWORD)
    assert check_tls(parse_settings(encrypted)) is None
    monkeypatch.setenv("REWARD_SERVER_SSL_KEYFILE_PASSWORD", "nope")
    assert check_tls(parse_settings(encrypted)) == (
        f"--ssl-keyfile-password does not decrypt --ssl-keyfile {pki.encrypted_key}"
    )
    monkeypatch.delenv("REWARD_SERVER_SSL_KEYFILE_PASSWORD")
    assert check_tls(parse_settings(encrypted)) == (
        f"--ssl-keyfile {pki.encrypted_key} is encrypted: give its password with "
        "--ssl-keyfile-password (or REWARD_SERVER_SSL_KEYFILE_PASSWORD)"
    )
