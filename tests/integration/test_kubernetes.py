"""Kubernetes manifests (deploy/kubernetes) checked offline, without a cluster.

Every overlay, every overlay with each autoscaling/monitoring component, and the examples
are rendered with ``kubectl kustomize``. The rendered objects validate against the
Kubernetes API schemas that the ``kubernetes-validate`` package carries (strict: an unknown
field fails), the KEDA ScaledObject, the ServiceMonitor and the PrometheusRule against models
generated from their CRDs' schemas (``cloudcoil-models-keda``, ``cloudcoil-models-prometheus-operator``).
They must also agree with the code: every ``REWARD_SERVER_*`` name is a ``ServerSettings``
field and its value parses, the probes hit the server's real routes on its port, the
metric names in the scalers' queries are metrics the server exports, the trainer Job's
command and config parse with ``ppo-client``'s own parsers, the pods are locked down, and
the grace period outlasts the preStop sleep plus the drain.

``kubectl`` is part of this machine image; without it these tests skip, unless
``REWARD_SERVER_TEST_KUBECTL=1`` (set by ``make test``) makes the absence a failure.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pydantic
import pytest
import yaml
from helpers.kubernetes import (
    CRD_MODELS,
    DRAIN_ANNOTATION,
    GPU,
    K8S,
    KUBECTL,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    ROOT,
    SERVER_TARGETS,
    TARGETS,
    Doc,
    check_locked_down,
    cli_flags,
    container,
    environment,
    gpus,
    of_kind,
    one,
    pod_spec,
    prestop_seconds,
    render,
    server,
    validate_custom_resource,
)
from server_proc import require_counterpart

from ppo_client.cli import build_parser as ppo_parser
from ppo_client.config import PPOConfig, RewardEnvironment
from reward_server.config import ENV_PREFIX, ServerSettings, parse_models_file
from reward_server.http.metrics import app_metrics
from reward_server.http.routes import router

require_counterpart(KUBECTL is not None, "REWARD_SERVER_TEST_KUBECTL", "kubectl")

# ----------------------------------------------------------------------------------------
# What the code says.


def setting_env_names() -> dict[str, str]:
    """``REWARD_SERVER_FIELD`` -> field, for every ServerSettings field."""
    return {ENV_PREFIX + name.upper(): name for name in ServerSettings.model_fields}


def unknown_server_names(env: dict[str, str | None], argv: list[str]) -> list[str]:
    """``REWARD_SERVER_*`` variables and ``--flags`` that are no server setting."""
    known = setting_env_names()
    flags = {"--" + name.replace("_", "-") for name in ServerSettings.model_fields}
    bad = [name for name in env if name.startswith(ENV_PREFIX) and name not in known]
    return bad + [flag for flag in cli_flags(argv) if flag not in flags]


def get_routes() -> set[str]:
    return {route.path for route in router.routes if "GET" in getattr(route, "methods", set())}


def exported_metrics() -> set[str]:
    """Every series name the server's /metrics can carry."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    return {
        family.name + suffix
        for family in app_metrics()[0].registry.collect()
        for suffix in suffixes[family.type]
    }


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\breward_server_[a-z_]+\b", text))


# ----------------------------------------------------------------------------------------
# Rendering and schemas.


@pytest.mark.parametrize("target", TARGETS)
def test_every_overlay_renders(target: str) -> None:
    """kubectl kustomize renders each target; the server's objects are all there."""
    docs = render(target)
    kinds = {doc["kind"] for doc in docs}
    if target == "examples/trainer":
        assert {"Job", "ConfigMap", "PersistentVolumeClaim"} <= kinds
        return
    if target.endswith("model-cache-pvc"):
        volumes = {v["name"]: v for v in pod_spec(server(docs)[0])["volumes"]}
        assert volumes["model-cache"] == {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": "reward-model-cache"},
        }
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap"} <= kinds
    services = {doc["metadata"]["name"] for doc in of_kind(docs, "Service")}
    assert services == {"reward-server", "reward-server-headless"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_manifests_validate_against_kubernetes_schemas(target: str, version: str) -> None:
    """Each built-in object is valid for the Kubernetes API, unknown fields included."""
    checked = 0
    for doc in render(target):
        if doc["kind"] in CRD_MODELS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            name = f"{doc['kind']}/{doc['metadata']['name']}"
            pytest.fail(f"{target}: {name} is invalid for Kubernetes {version}: {exc}")
        checked += 1
    assert checked >= 3


def test_kubernetes_validation_catches_mistakes() -> None:
    """The schema check fails on an unknown field and on a wrong type (it is not a no-op)."""
    deployment = copy.deepcopy(server(render("overlays/cpu"))[0])
    spec = container(deployment)
    spec["readinessProbe"]["httpGett"] = spec["readinessProbe"].pop("httpGet")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    deployment = copy.deepcopy(server(render("overlays/cpu"))[0])
    pod_spec(deployment)["terminationGracePeriodSeconds"] = "sixty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def custom_resources() -> Iterator[tuple[str, Doc]]:
    for target in TARGETS:
        for doc in render(target):
            if doc["kind"] in CRD_MODELS:
                yield target, doc


def test_custom_resources_validate_against_their_crds() -> None:
    """The ScaledObject, the ServiceMonitor and the PrometheusRule validate against the KEDA
    and Prometheus operator CRD schemas (as pydantic models generated from them)."""
    seen = set()
    for _target, doc in custom_resources():
        validate_custom_resource(doc)
        seen.add(doc["kind"])
    assert seen == set(CRD_MODELS)


def test_crd_validation_catches_mistakes() -> None:
    """A misspelled field, a wrong type and a missing required field are all rejected."""
    scaled = one(render("overlays/gpu+components/keda"), "ScaledObject")
    typo = copy.deepcopy(scaled)
    typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")
    wrong_type = copy.deepcopy(scaled)
    wrong_type["spec"]["triggers"] = "prometheus"
    missing = copy.deepcopy(scaled)
    del missing["spec"]["scaleTargetRef"]
    for bad in (typo, wrong_type, missing):
        with pytest.raises((AssertionError, pydantic.ValidationError)):
            validate_custom_resource(bad)


# ----------------------------------------------------------------------------------------
# Agreement with the server.


def mounted_file(docs: tuple[Doc, ...], workload: Doc, path: str) -> str | None:
    """The text of the file at ``path`` in the workload's container, where a ConfigMap
    volume mounted there holds it (None otherwise)."""
    mounts = {m["name"]: m["mountPath"] for m in container(workload)["volumeMounts"]}
    for volume in pod_spec(workload)["volumes"]:
        where = mounts.get(volume["name"])
        if "configMap" in volume and where is not None and Path(path).parent == Path(where):
            data = one(docs, "ConfigMap", volume["configMap"]["name"])["data"]
            return data.get(Path(path).name)  # type: ignore[no-any-return]
    return None


@pytest.mark.parametrize("target", SERVER_TARGETS)
def test_server_environment_names_and_values_are_settings(
    target: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every REWARD_SERVER_* name (and --flag) is a ServerSettings field, and the values
    parse: the server would start with exactly this configuration (a models file from a
    mounted ConfigMap included)."""
    docs = render(target)
    deployment, spec = server(docs)
    env = environment(docs, spec)
    models = env.get(ENV_PREFIX + "MODELS")
    if models:
        text = mounted_file(docs, deployment, models)
        assert text is not None, f"{models} is no file of a mounted ConfigMap"
        (tmp_path / "models.yaml").write_text(text)
        env[ENV_PREFIX + "MODELS"] = str(tmp_path / "models.yaml")
    argv = [*spec.get("command", []), *spec.get("args", [])]
    assert unknown_server_names(env, argv) == []
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            # None: from the Secret; any string stands in for it.
            monkeypatch.setenv(name, "stand-in" if value is None else value)
    settings = ServerSettings()
    assert settings.host in ("0.0.0.0", "::"), "the server must listen on the pod's address"
    assert settings.api_key is not None, "the API key must come from the Secret"
    assert env["HF_HOME"] in {m["mountPath"] for m in spec["volumeMounts"]}


def test_unknown_server_names_are_reported() -> None:
    """The name check flags a setting that does not exist (renamed or misspelled)."""
    env: dict[str, str | None] = {"REWARD_SERVER_MODEL": "m", "REWARD_SERVER_MAX_QUEUES": "1"}
    argv = ["reward-server", "--max-batch-tokens=4096", "--max-batch-tokenz", "1"]
    assert unknown_server_names(env, argv) == ["REWARD_SERVER_MAX_QUEUES", "--max-batch-tokenz"]


@pytest.mark.parametrize("target", SERVER_TARGETS)
def test_probes_and_ports_match_the_server(target: str) -> None:
    """The probes call the server's /health on the port it listens on; both Services send
    traffic there; the readiness endpoint is the one that says 503 while loading/draining."""
    docs = render(target)
    _, spec = server(docs)
    env = environment(docs, spec)
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    assert ports == {"http": int(env["REWARD_SERVER_PORT"] or "")}
    routes = get_routes()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        action = spec[probe]["httpGet"]
        assert action["path"] in routes, f"{probe}: no GET route {action['path']}"
        assert action["port"] in ports or action["port"] in ports.values()
    assert spec["readinessProbe"]["httpGet"]["path"] == "/health"
    assert spec["startupProbe"]["httpGet"]["path"] == "/health"
    for service in of_kind(docs, "Service"):
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    headless = one(docs, "Service", "reward-server-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is False


@pytest.mark.parametrize("target", SERVER_TARGETS)
def test_startup_probe_allows_a_large_model_to_load(target: str) -> None:
    """At least 10 minutes (the Docker image's start period) to load a model."""
    probe = server(render(target))[1]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600


@pytest.mark.parametrize("target", SERVER_TARGETS)
def test_grace_period_covers_prestop_and_drain(target: str) -> None:
    """SIGTERM comes after the preStop sleep; the server then drains (no timeout of its
    own). The kubelet's SIGKILL must come after both."""
    deployment, spec = server(render(target))
    budget = int(deployment["spec"]["template"]["metadata"]["annotations"][DRAIN_ANNOTATION])
    grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
    sleep = prestop_seconds(spec)
    assert sleep >= 5, "endpoints and DNS need a few seconds to drop the pod"
    assert budget > 0
    assert grace > sleep + budget, f"grace {grace} s <= preStop {sleep} s + drain {budget} s"


@pytest.mark.parametrize("target", TARGETS)
def test_pods_are_locked_down(target: str) -> None:
    """Non-root, no privilege escalation, no capabilities, seccomp, read-only root with
    writable emptyDirs where the programs write, no service account token."""
    workloads = [d for d in render(target) if d["kind"] in ("Deployment", "Job")]
    assert workloads
    for workload in workloads:
        check_locked_down(workload, sandboxes=target.endswith("code-rewards"))


# ----------------------------------------------------------------------------------------
# Overlays.


def test_cpu_overlay_threads_match_the_cpu_request() -> None:
    """torch's thread pools sized to the pod's cores, not the node's."""
    docs = render("overlays/cpu")
    _, spec = server(docs)
    env = environment(docs, spec)
    cores = spec["resources"]["requests"]["cpu"]
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == str(cores)
    assert env["REWARD_SERVER_DEVICE"] == "cpu"
    assert gpus(spec) == 0


def tolerates_gpu_taint(workload: Doc) -> bool:
    return any(t["key"] == GPU for t in pod_spec(workload).get("tolerations", []))


def test_gpu_overlay_has_one_gpu_per_replica() -> None:
    docs = render("overlays/gpu")
    deployment, spec = server(docs)
    assert gpus(spec) == 1
    assert tolerates_gpu_taint(deployment)
    assert environment(docs, spec)["REWARD_SERVER_DEVICE"] == "cuda"
    assert spec["image"].endswith(":cuda")


def shm_is_memory(workload: Doc) -> bool:
    spec = container(workload)
    shm = {m["name"] for m in spec["volumeMounts"] if m["mountPath"] == "/dev/shm"}
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    return len(shm) == 1 and volumes[shm.pop()]["emptyDir"]["medium"] == "Memory"


def test_vllm_overlay_shards_over_the_gpus_it_requests() -> None:
    """--engine vllm, tensor parallel size == GPUs of the one pod, /dev/shm in memory."""
    docs = render("overlays/vllm-tp")
    deployment, spec = server(docs)
    env = environment(docs, spec)
    assert env["REWARD_SERVER_ENGINE"] == "vllm"
    assert int(env["REWARD_SERVER_TENSOR_PARALLEL_SIZE"] or "") == gpus(spec) >= 2
    assert shm_is_memory(deployment)
    assert tolerates_gpu_taint(deployment)
    assert spec["image"].endswith(":vllm")


# ----------------------------------------------------------------------------------------
# Autoscaling and monitoring.


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", ["keda", "hpa"])
def test_autoscalers_own_the_replica_count(overlay: str, component: str) -> None:
    """The scaler targets the Deployment, which no longer pins its replicas."""
    docs = render(f"overlays/{overlay}+components/{component}")
    deployment, _ = server(docs)
    assert "replicas" not in deployment["spec"]
    assert "replicas" in server(render(f"overlays/{overlay}"))[0]["spec"]
    kind = "ScaledObject" if component == "keda" else "HorizontalPodAutoscaler"
    target = one(docs, kind)["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "reward-server")


def test_scaling_metrics_are_exported_by_the_server() -> None:
    """KEDA's query, the HPA's metric and the adapter rule name real series of /metrics,
    and they are the queue depth."""
    exported = exported_metrics()
    assert "reward_server_queue_items" in exported
    used: set[str] = set()
    for target in TARGETS:
        for doc in of_kind(render(target), "ScaledObject"):
            for trigger in doc["spec"]["triggers"]:
                used |= metric_names(trigger["metadata"]["query"])
        for doc in of_kind(render(target), "HorizontalPodAutoscaler"):
            used |= {m["pods"]["metric"]["name"] for m in doc["spec"]["metrics"]}
    rules = (K8S / "components" / "hpa" / "prometheus-adapter-rules.yaml").read_text()
    used |= metric_names(rules)
    assert used == {"reward_server_queue_items"}
    assert used <= exported


def test_servicemonitor_scrapes_metrics_once_per_pod() -> None:
    """It selects the ClusterIP Service only, on its named port, at the /metrics route."""
    docs = render("overlays/gpu+components/servicemonitor")
    monitor = one(docs, "ServiceMonitor")["spec"]
    selected = [
        s
        for s in of_kind(docs, "Service")
        if monitor["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == ["reward-server"]
    port_names = {p["name"] for p in selected[0]["spec"]["ports"]}
    for endpoint in monitor["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] in get_routes() and endpoint["path"] == "/metrics"


def test_prometheus_rule_ships_the_alert_rules() -> None:
    """The servicemonitor component's PrometheusRule carries deploy/observability/alerts.yml's
    groups exactly (the rules the compose profile's Prometheus loads), and its expressions
    name only series the server exports."""
    docs = render("overlays/gpu+components/servicemonitor")
    rule = one(docs, "PrometheusRule")
    alerts = yaml.safe_load((ROOT / "deploy" / "observability" / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    assert rule["metadata"]["labels"] == one(docs, "ServiceMonitor")["metadata"]["labels"]
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    assert metric_names(exprs) and metric_names(exprs) <= exported_metrics()


# ----------------------------------------------------------------------------------------
# The trainer Job.


def test_trainer_job_runs_ppo_client_against_the_service() -> None:
    """accelerate's flags parse and ask for the GPUs the pod has; ppo-client's arguments
    parse; its config is a valid PPOConfig; REWARD_URL names a server Service and port."""
    from accelerate.commands.launch import launch_command_parser

    docs = render("examples/trainer")
    job = one(docs, "Job")
    spec = container(job)
    command = spec["command"]
    assert command[:2] == ["accelerate", "launch"]
    module = command.index("-m")
    launch = launch_command_parser().parse_args([*command[2:module], "x.py"])
    assert launch.num_processes == gpus(spec) >= 2
    assert command[module + 1] == "ppo_client"
    args, rest = ppo_parser().parse_known_args(command[module + 2 :])
    assert args.command == "train" and rest == []
    mounts = {m["mountPath"]: m["name"] for m in spec["volumeMounts"]}
    volume = next(v for v in pod_spec(job)["volumes"] if v["name"] == mounts["/config"])
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    config = PPOConfig.from_dict(yaml.safe_load(config_map["data"][Path(args.config).name]))
    assert config.output_dir.startswith("/app/runs") and "/app/runs" in mounts
    env = environment(docs, spec)
    aliases = {f.validation_alias for f in RewardEnvironment.model_fields.values()}
    assert {name for name in env if name.startswith("REWARD_")} <= aliases
    assert shm_is_memory(job) and tolerates_gpu_taint(job)
    url = urlsplit(env["REWARD_URL"] or "")
    service = one(render("overlays/gpu"), "Service", (url.hostname or "").split(".")[0])
    assert url.port in {p["port"] for p in service["spec"]["ports"]}


# ----------------------------------------------------------------------------------------
# Code rewards.


def _bytes(quantity: str) -> int:
    """A memory quantity (``6Gi``, ``512Mi``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_code_rewards_component_serves_a_code_verifier_sized_to_its_pod(overlay: str) -> None:
    """The component's models file parses as the server reads it and holds one code
    verifier whose test slots are the pod's CPU request and whose programs' memory fits in
    the container's limit; the image is the Dockerfile's server-code target."""
    docs = render(f"overlays/{overlay}+components/code-rewards")
    deployment, spec = server(docs)
    env = environment(docs, spec)
    assert env[ENV_PREFIX + "MODEL"] == ""
    text = mounted_file(docs, deployment, env[ENV_PREFIX + "MODELS"] or "")
    assert text is not None
    models = parse_models_file(yaml.safe_load(text))
    (code,) = [m for m in models.models if m.verifier == "code"]
    assert code.sandbox == "bwrap"
    assert code.parallel_tests == int(spec["resources"]["requests"]["cpu"])
    limit = _bytes(spec["resources"]["limits"]["memory"])
    assert code.parallel_tests * code.memory_mb * 2**20 < limit
    assert spec["image"].endswith(":code")
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert re.search(r"^FROM \S+ AS server-code$", dockerfile, re.MULTILINE)
