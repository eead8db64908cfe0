"""Kubernetes manifests (deploy/kubernetes) offline: rendered with ``kubectl kustomize``
(a target is a folder, or ``overlay+component``), read (the server's Deployment, a
container's environment), checked against the CRDs' models and for a locked-down pod.

A module using these gates on kubectl itself: ``require_counterpart(KUBECTL is not None,
"REWARD_SERVER_TEST_KUBECTL", "kubectl")``.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pydantic
import yaml

KUBECTL = shutil.which("kubectl")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "vllm-tp")
COMPONENTS = ("keda", "hpa", "servicemonitor", "model-cache-pvc", "tls", "code-rewards")
#: What can be applied: each overlay, each overlay plus one component, the examples.
TARGETS = (
    *(f"overlays/{o}" for o in OVERLAYS),
    *(f"overlays/{o}+components/{c}" for o in OVERLAYS for c in COMPONENTS),
    "examples/production",
    "examples/trainer",
)
SERVER_TARGETS = tuple(t for t in TARGETS if t != "examples/trainer")
#: The oldest Kubernetes minor the manifests support (README) and the newest schemas shipped.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
#: Kinds whose schemas are CRDs, checked against their CRD models instead: the module of
#: each model (imported when a check needs it: the models take seconds to import, which
#: every pytest worker would pay at collection).
CRD_MODELS: dict[str, str] = {
    "ScaledObject": "cloudcoil.models.keda.v1alpha1",
    "ServiceMonitor": "cloudcoil.models.prometheus_operator.v1",
    "PrometheusRule": "cloudcoil.models.prometheus_operator.v1",
}
DRAIN_ANNOTATION = "remote-reward/drain-budget-seconds"
GPU = "nvidia.com/gpu"

Doc = dict[str, Any]


def _kustomize(folder: Path) -> tuple[Doc, ...]:
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {folder} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


@functools.cache
def render(target: str) -> tuple[Doc, ...]:
    """The objects of ``target``: a folder under deploy/kubernetes, or ``overlay+component``
    (rendered through a throwaway kustomization that adds the component)."""
    if "+" not in target:
        return _kustomize(K8S / target)
    overlay, component = target.split("+")
    with tempfile.TemporaryDirectory() as tmp:
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(K8S / overlay, tmp)],
            "components": [os.path.relpath(K8S / component, tmp)],
        }
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return _kustomize(Path(tmp))


def of_kind(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: tuple[Doc, ...], kind: str, name: str | None = None) -> Doc:
    """The single object of ``kind`` (named ``name``, when given)."""
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(workload: Doc) -> Doc:
    """The workload's one container."""
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def server(docs: tuple[Doc, ...]) -> tuple[Doc, Doc]:
    """The reward server's Deployment and its container."""
    deployment = one(docs, "Deployment", "reward-server")
    return deployment, container(deployment)


def environment(docs: tuple[Doc, ...], spec: Doc) -> dict[str, str | None]:
    """A container's environment: envFrom ConfigMaps resolved, then env (None: a Secret's)."""
    env: dict[str, str | None] = {}
    for source in spec.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        env.update(one(docs, "ConfigMap", ref)["data"])
    for var in spec.get("env", []):
        env[var["name"]] = var.get("value")
    return env


def cli_flags(argv: list[str]) -> list[str]:
    """The ``--flag`` names in a command line (``--flag=value`` too)."""
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]


def prestop_seconds(spec: Doc) -> int:
    """Seconds a container's preStop hook sleeps (exec sleep N, or the sleep action)."""
    hook = spec["lifecycle"]["preStop"]
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    assert Path(command[0]).name == "sleep" and len(command) == 2, command
    return int(command[1])


def gpus(spec: Doc) -> int:
    return int(spec["resources"].get("limits", {}).get(GPU, 0))


def validate_custom_resource(doc: Doc) -> None:
    """Validate against the CRD's model; an unknown field (which the models drop) fails."""
    kind = doc["kind"]
    model_class: type[pydantic.BaseModel] = getattr(importlib.import_module(CRD_MODELS[kind]), kind)
    model = model_class.model_validate(doc)
    kept = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert kept == doc, f"{doc['kind']}: fields the CRD does not know: {doc} != {kept}"


#: What the code rewards' sandbox needs of its container (components/code-rewards), and
#: nothing more: the runtime's seccomp and AppArmor profiles off, /proc unmasked.
SANDBOX_EXCEPTIONS = {
    "seccompProfile": {"type": "Unconfined"},
    "appArmorProfile": {"type": "Unconfined"},
    "procMount": "Unmasked",
}


def check_locked_down(workload: Doc, *, sandboxes: bool = False) -> None:
    """``sandboxes``: the container runs code rewards' sandboxes: a user namespace of the
    pod's own and SANDBOX_EXCEPTIONS, no capability or privilege more."""
    pod = pod_spec(workload)
    assert pod["automountServiceAccountToken"] is False
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] != 0 and context["runAsGroup"] != 0
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    spec = container(workload)
    own = dict(spec["securityContext"])
    exceptions = {key: own.pop(key) for key in SANDBOX_EXCEPTIONS if key in own}
    if sandboxes:
        assert pod["hostUsers"] is False
        assert exceptions == SANDBOX_EXCEPTIONS
    else:
        assert "hostUsers" not in pod and not exceptions
    assert own["allowPrivilegeEscalation"] is False
    assert own["readOnlyRootFilesystem"] is True
    assert own["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in own
    mounts = {m["mountPath"] for m in spec["volumeMounts"]}
    assert {"/tmp", "/home/app", "/cache/huggingface"} <= mounts
    assert "requests" in spec["resources"] and "memory" in spec["resources"]["limits"]
