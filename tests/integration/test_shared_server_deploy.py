"""The shared-server deploy examples, checked offline like tests/integration/test_kubernetes.py.

``components/tls`` (a ``kubernetes.io/tls`` Secret mounted read-only, HTTPS probes),
``components/api-keys`` (the tenants file from a Secret) and ``examples/shared-server``
(both, on the GPU overlay, scraped over HTTPS) render, validate against the Kubernetes
schemas and the ServiceMonitor CRD, and agree with the server: with the mounted files
stood in by a test certificate and examples/api_keys.yaml, the container's environment
loads as settings and the certificate check of ``reward-server`` passes. compose's
``deploy/compose/shared-server.yaml`` is checked the same way. The default deployments stay
plain HTTP with one API key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helpers.kubernetes import (
    CRD_MODELS,
    K8S,
    KUBECTL,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    Doc,
    check_locked_down,
    environment,
    one,
    pod_spec,
    render,
    server,
    validate_custom_resource,
)
from helpers.pki import make_pki
from server_proc import require_counterpart

from reward_server.cli import check_tls
from reward_server.config import ENV_PREFIX, ServerSettings

require_counterpart(KUBECTL is not None, "REWARD_SERVER_TEST_KUBECTL", "kubectl")

ROOT = K8S.parents[1]
SHARED = "examples/shared-server"
TLS_SECRET = "reward-server-tls"
KEYS_SECRET = "reward-server-api-keys"
COMPOSE_SHARED = ROOT / "deploy" / "compose" / "shared-server.yaml"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def secret_mounts(docs: tuple[Doc, ...]) -> dict[str, tuple[str, dict]]:
    """mount path -> (Secret name, the mount) for the server container's Secret volumes."""
    deployment, spec = server(docs)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    return {
        m["mountPath"]: (volumes[m["name"]]["secret"]["secretName"], m)
        for m in spec["volumeMounts"]
        if "secret" in volumes[m["name"]]
    }


def load_settings(
    env: dict[str, str | None],
    files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> ServerSettings:
    """The container's REWARD_SERVER_* settings, each value naming a mounted file replaced by
    its stand-in in ``files`` (container path -> local file); a Secret's value -> stand-in."""
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            value = "stand-in" if value is None else value
            monkeypatch.setenv(name, str(files.get(value, value)))
    return ServerSettings()


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The files the Secrets hold in the pod, as local files: a test certificate and key,
    and the example tenants file."""
    folder = tmp_path_factory.mktemp("secrets")
    pki = make_pki(folder)
    keys = folder / "api_keys.yaml"
    shutil.copy(ROOT / "examples" / "api_keys.yaml", keys)
    return {
        "/etc/reward-server/tls/tls.crt": pki.cert,
        "/etc/reward-server/tls/tls.key": pki.key,
        "/etc/reward-server/keys/api_keys.yaml": keys,
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tls_component_mounts_the_certificate(overlay: str) -> None:
    """The certificate and key come from the kubernetes.io/tls Secret's tls.crt and tls.key,
    mounted read-only, readable by the server's group only; the probes use HTTPS on the
    same route and port. Without the component nothing of it is there."""
    docs = render(f"overlays/{overlay}+components/tls")
    deployment, spec = server(docs)
    env = environment(docs, spec)
    mounts = secret_mounts(docs)
    tls = [path for path, (secret, _) in mounts.items() if secret == TLS_SECRET]
    assert len(tls) == 1
    folder = tls[0]
    assert mounts[folder][1]["readOnly"] is True
    assert env[ENV_PREFIX + "SSL_CERTFILE"] == f"{folder}/tls.crt"
    assert env[ENV_PREFIX + "SSL_KEYFILE"] == f"{folder}/tls.key"
    volume = next(
        v for v in pod_spec(deployment)["volumes"] if v["name"] == mounts[folder][1]["name"]
    )
    assert volume["secret"]["defaultMode"] == 0o440
    assert pod_spec(deployment)["securityContext"]["fsGroup"] == 10001
    plain = server(render(f"overlays/{overlay}"))[1]
    for probe in PROBES:
        assert spec[probe]["httpGet"] == {**plain[probe]["httpGet"], "scheme": "HTTPS"}
        assert "scheme" not in plain[probe]["httpGet"]
    assert not any(k.startswith(ENV_PREFIX + "SSL") for k in environment(docs, plain))
    assert secret_mounts(render(f"overlays/{overlay}")) == {}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_shared_server_validates(version: str) -> None:
    """Every object of the example is valid for the Kubernetes API (strict), the
    ServiceMonitor and the PrometheusRule for their CRDs, and the pods are locked down."""
    docs = render(SHARED)
    for doc in docs:
        if doc["kind"] in CRD_MODELS:
            validate_custom_resource(doc)
            continue
        kubernetes_validate.validate(doc, version, strict=True)
    check_locked_down(server(docs)[0])


def test_shared_server_loads_as_settings(
    stand_ins: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tenants file replaces the single key; with the Secrets' files in place the
    settings load and the certificate check passes: the server would start like this."""
    docs = render(SHARED)
    _, spec = server(docs)
    env = environment(docs, spec)
    assert ENV_PREFIX + "API_KEY" not in env
    mounts = secret_mounts(docs)
    keys_file = env[ENV_PREFIX + "API_KEYS"] or ""
    folder, name = keys_file.rsplit("/", 1)
    assert mounts[folder][0] == KEYS_SECRET and mounts[folder][1]["readOnly"] is True
    assert name == "api_keys.yaml" and "subPath" not in mounts[folder][1]  # updates reach it
    assert {stand_ins[keys_file].name} == {name}
    settings = load_settings(env, stand_ins, monkeypatch)
    assert settings.host == "0.0.0.0" and settings.tls
    assert settings.api_key is None and settings.api_keys == str(stand_ins[keys_file])
    assert check_tls(settings) is None


def test_shared_server_is_scraped_over_https() -> None:
    """The ServiceMonitor (listed before the tls component) scrapes with TLS, checking the
    certificate against the Secret's CA for the ClusterIP Service's name."""
    docs = render(SHARED)
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": TLS_SECRET, "key": "ca.crt"}
    service = endpoint["tlsConfig"]["serverName"]
    assert one(docs, "Service", service)["metadata"]["labels"]["remote-reward/metrics"] == "true"


def test_example_secrets_match_the_mounts() -> None:
    """The example Secrets are valid, of the right type, with the keys the mounts read."""
    tls = yaml.safe_load((K8S / "components" / "tls" / "secret.example.yaml").read_text())
    keys = yaml.safe_load((K8S / "components" / "api-keys" / "secret.example.yaml").read_text())
    for secret in (tls, keys):
        kubernetes_validate.validate(secret, KUBERNETES_VERSIONS[-1], strict=True)
    assert tls["metadata"]["name"] == TLS_SECRET and tls["type"] == "kubernetes.io/tls"
    assert {"tls.crt", "tls.key"} <= set(tls["stringData"])
    assert keys["metadata"]["name"] == KEYS_SECRET
    assert set(keys["stringData"]) == {"api_keys.yaml"}
    tenants = yaml.safe_load(keys["stringData"]["api_keys.yaml"])["tenants"]
    assert [t["name"] for t in tenants] == ["sweep", "grpo-main", "eval"]


# ----------------------------------------------------------------------------------------
# compose


def compose_override() -> dict:
    return yaml.safe_load(COMPOSE_SHARED.read_text())  # type: ignore[no-any-return]


def test_compose_override_validates() -> None:
    """The override file matches the compose specification's schema."""
    checker = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_SHARED)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_override_loads_as_settings(
    stand_ins: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its server gets the certificate, key and tenants file, each from a read-only mount,
    instead of a single key; with stand-ins for the files the settings load and the
    certificate check passes. The trainer gets an https URL and the CA."""
    services = compose_override()["services"]
    reward = services["reward-server"]
    env = {k: (None if v is None else str(v)) for k, v in reward["environment"].items()}
    assert ENV_PREFIX + "API_KEY" not in env  # compose.yaml passes the shell's through
    mounted = {m["target"]: m for m in reward["volumes"]}
    for name in ("SSL_CERTFILE", "SSL_KEYFILE", "API_KEYS"):
        path = env[ENV_PREFIX + name] or ""
        holders = [t for t in mounted if path.startswith(t.rstrip("/") + "/")]
        assert holders and all(mounted[t]["read_only"] for t in holders), path
    full = {ENV_PREFIX + "MODEL": "/models/reward", **env}
    settings = load_settings(full, stand_ins, monkeypatch)
    assert settings.tls and settings.api_keys is not None and settings.api_key is None
    assert check_tls(settings) is None
    trainer = services["trainer"]["environment"]
    assert str(trainer["REWARD_URL"]).startswith("${REWARD_URL:-https://reward-server:8000")
    ca = str(trainer["REWARD_CA_BUNDLE"])
    assert any(ca.startswith(m["target"]) for m in services["trainer"]["volumes"])
