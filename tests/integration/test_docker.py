"""Docker and compose checks that need no Docker engine.

hadolint on every Dockerfile, compose.yaml against the compose specification's JSON schema,
and the consistency between the images, compose.yaml, pyproject.toml and the server's
settings: every REWARD_SERVER_* variable is a real setting, every command is a real console
script or module, compose runs what the images' CMDs say, the images run as non-root, and
the image's health probe really tells a healthy server from an unhealthy one.
"""

from __future__ import annotations

import ast
import fnmatch
import http.server
import importlib.metadata
import importlib.util
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import server_proc
import yaml
from dependency_closure import dependency_closure
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from reward_server.config import ENV_PREFIX, ServerSettings, parse_models_file
from reward_server.sandbox import language

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "docker"
DOCKERFILES = sorted(DOCKER_DIR.glob("Dockerfile*"))
COMPOSE_FILE = ROOT / "compose.yaml"
BIN = Path(sys.executable).parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONSOLE_SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
IMAGE_TARGETS = ("server", "trainer", "demo", "server-vllm", "server-code")
WHEEL_STAGE = "wheel"  # builds the project's wheel once for every image


# ----------------------------------------------------------------------------------------
# A small Dockerfile reader: stages, instructions, and what a target stage inherits.


@dataclass
class Stage:
    """One FROM ... AS name block of a Dockerfile."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def _logical_lines(text: str) -> Iterator[str]:
    """Instructions with continuation lines joined and comment lines dropped."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may also sit between continuation lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def parse_dockerfile(path: Path) -> tuple[dict[str, str], dict[str, Stage]]:
    """Global ARG defaults (before the first FROM) and the stages by name, in file order."""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in _logical_lines(path.read_text(encoding="utf-8")):
        instruction, _, args = line.partition(" ")
        instruction, args = instruction.upper(), args.strip()
        if instruction == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else str(len(stages))
            current = Stage(name=name, base=words[0])
            stages[name] = current
        elif current is None:
            if instruction == "ARG":
                key, _, default = args.partition("=")
                global_args[key] = default
        else:
            current.instructions.append((instruction, args))
    return global_args, stages


def stage_chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and its ancestors, root first (``FROM base AS server`` -> [base, server])."""
    chain = [stages[name]]
    while chain[0].base in stages:
        chain.insert(0, stages[chain[0].base])
    return chain


def instructions(stages: dict[str, Stage], name: str) -> list[tuple[str, str]]:
    """Every instruction a target stage runs, inherited ones first."""
    return [item for stage in stage_chain(stages, name) for item in stage.instructions]


def last(stages: dict[str, Stage], name: str, instruction: str) -> str | None:
    """Arguments of the last ``instruction`` in effect for the target (e.g. CMD, USER)."""
    found = [args for instr, args in instructions(stages, name) if instr == instruction]
    return found[-1] if found else None


def env_of(stages: dict[str, Stage], name: str) -> dict[str, str]:
    """The ENV variables a target stage sets (its own and inherited)."""
    env: dict[str, str] = {}
    for instr, args in instructions(stages, name):
        if instr != "ENV":
            continue
        words = shlex.split(args)
        if words and "=" not in words[0]:  # legacy form: ENV KEY value
            env[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            key, _, value = word.partition("=")
            env[key] = value
    return env


def exec_form(args: str) -> list[str]:
    """The argv of a JSON (exec) form CMD/ENTRYPOINT; shell form is rejected."""
    argv = json.loads(args)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), args
    return argv


def healthcheck_argv(args: str) -> list[str]:
    """The argv of ``HEALTHCHECK [--options] CMD [...]``."""
    match = re.search(r"\bCMD\s+(\[.*\])\s*$", args)
    assert match, f"HEALTHCHECK must use CMD in exec form, got: {args}"
    return exec_form(match.group(1))


def copies(stages: dict[str, Stage], name: str) -> dict[str, str]:
    """Paths in the image -> their source in the build context (COPY without --from)."""
    result: dict[str, str] = {}
    workdir = "/"
    for instr, args in instructions(stages, name):
        if instr == "WORKDIR":
            workdir = posixpath.join(workdir, args)
        elif instr in ("COPY", "ADD"):
            words = shlex.split(args)
            if any(w.startswith("--from") for w in words):
                continue
            *sources, dest = [w for w in words if not w.startswith("--")]
            into_dir = dest.endswith("/") or len(sources) > 1
            dest = posixpath.normpath(posixpath.join(workdir, dest))
            for source in sources:
                image_path = posixpath.join(dest, posixpath.basename(source)) if into_dir else dest
                result[image_path] = source
    return result


# One file: the images (server, trainer, demo, server-vllm) and the stages they build on.
GLOBAL_ARGS, STAGES = parse_dockerfile(DOCKER_DIR / "Dockerfile")
COMPOSE = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
SERVICES: dict[str, dict] = COMPOSE["services"]


# ----------------------------------------------------------------------------------------
# Compose helpers.

_INTERPOLATION = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
)


def interpolate(value: object, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}``, given ``env``."""
    env = env or {}

    def replace(match: re.Match[str]) -> str:
        name, op, arg = match.group("name", "op", "arg")
        current = env.get(name)
        if op in (":-", "-"):
            unset = current is None or (op == ":-" and current == "")
            return arg if unset else str(current)
        assert op is None, f"unsupported interpolation {match.group(0)}"
        return current or ""

    return _INTERPOLATION.sub(replace, str(value)).replace("$$", "$")


def service_env(name: str) -> dict[str, str | None]:
    """A service's environment as a mapping (``None``: passed through from the shell)."""
    env = SERVICES[name].get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {key: None if value is None else str(value) for key, value in env.items()}


def built_services() -> list[str]:
    """Every compose service built from docker/Dockerfile (the others run a published image:
    the `observability` profile's Prometheus and Grafana)."""
    return sorted(name for name, svc in SERVICES.items() if "build" in svc)


def reward_server_services() -> list[str]:
    """Every compose service built from the server target."""
    return [
        name for name, svc in SERVICES.items() if svc.get("build", {}).get("target") == "server"
    ]


def mounts(name: str) -> list[dict]:
    """A service's volumes in long form (short ``src:dst[:ro]`` strings converted)."""
    result = []
    for volume in SERVICES[name].get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            ro = len(parts) == 3 and "ro" in parts[2].split(",")
            volume = {"source": parts[0], "target": parts[1], "read_only": ro}
        result.append(volume)
    return result


def _compose_text() -> str:
    """compose.yaml without its comments (where ``${...}`` is not interpolated)."""
    lines = COMPOSE_FILE.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def documented_reward_urls() -> list[str]:
    """Every ``REWARD_URL=...`` value written in compose.yaml's comments."""
    comments = [ln for ln in COMPOSE_FILE.read_text().splitlines() if ln.lstrip().startswith("#")]
    return [m.group(1) for ln in comments for m in re.finditer(r"REWARD_URL=(\S+)", ln)]


# ----------------------------------------------------------------------------------------
# hadolint


def _hadolint(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run hadolint with an empty config (no rule ignored behind our back), strictest level."""
    empty_config = tmp_path / "hadolint.yaml"
    empty_config.write_text("{}\n")
    cmd = [str(BIN / "hadolint"), "--config", str(empty_config), "--no-color"]
    cmd += ["--failure-threshold", "style", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path, tmp_path: Path) -> None:
    """Every Dockerfile is clean under hadolint at its strictest threshold."""
    result = _hadolint(dockerfile, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_finds_violations(tmp_path: Path) -> None:
    """The linter really runs: a Dockerfile with known mistakes fails."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = _hadolint(bad, tmp_path)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3008" in result.stdout  # unpinned apt package


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_ignores_have_a_reason(dockerfile: Path) -> None:
    """Each ``# hadolint ignore=`` pragma follows a comment saying why; no global ignores."""
    lines = dockerfile.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore" in line:
            previous = lines[number - 1].strip() if number else ""
            assert previous.startswith("#") and "hadolint" not in previous, (
                f"{dockerfile.name}:{number + 1}: explain the ignored rule in the comment above"
            )
    assert not any(ROOT.glob(".hadolint.y*ml")), "rules must not be ignored project-wide"


# ----------------------------------------------------------------------------------------
# compose.yaml against the compose specification


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_compose_validates_against_compose_spec(tmp_path: Path) -> None:
    """compose.yaml matches the compose specification's schema, which rejects unknown keys."""
    result = _check_compose(COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE_FILE.read_text().replace("depends_on:", "depends_onn:"))
    assert _check_compose(broken).returncode != 0


# ----------------------------------------------------------------------------------------
# REWARD_SERVER_* environment


def _all_reward_server_vars() -> dict[str, str]:
    """Every REWARD_SERVER_* name set anywhere (Dockerfile stages, compose services)."""
    found: dict[str, str] = {}
    for stage in STAGES:
        for key in env_of(STAGES, stage):
            if key.startswith(ENV_PREFIX):
                found[key] = f"Dockerfile stage {stage}"
    for service in SERVICES:
        for key in service_env(service):
            if key.startswith(ENV_PREFIX):
                found[key] = f"compose service {service}"
    return found


def test_reward_server_variables_are_real_settings() -> None:
    """Each REWARD_SERVER_<NAME> set by the images or compose is a ServerSettings field."""
    fields = {ENV_PREFIX + name.upper() for name in ServerSettings.model_fields}
    found = _all_reward_server_vars()
    assert found, "no REWARD_SERVER_* variable found"
    unknown = {key: where for key, where in found.items() if key not in fields}
    assert not unknown, f"not a reward-server setting: {unknown}"
    # Variables compose reads from the user's shell: a REWARD_SERVER_ name there must be a
    # setting too, or it would look like one and do something else.
    interpolated = {m.group("name") for m in _INTERPOLATION.finditer(_compose_text())}
    assert {n for n in interpolated if n.startswith(ENV_PREFIX)} <= fields


@pytest.mark.parametrize("service", reward_server_services())
def test_compose_passes_every_server_flag(service: str) -> None:
    """Each setting is listed, so any flag can be given as REWARD_SERVER_<FLAG> to compose."""
    listed = {key for key in service_env(service) if key.startswith(ENV_PREFIX)}
    assert listed == {ENV_PREFIX + name.upper() for name in ServerSettings.model_fields}
    pinned = {k for k, v in service_env(service).items() if k in listed and v is not None}
    assert pinned == {ENV_PREFIX + "HOST", ENV_PREFIX + "PORT"}  # the rest pass through


def _container_env(service: str) -> dict[str, str]:
    """What the server sees in the container: image ENV, then compose's (defaults applied)."""
    env = {k: v for k, v in env_of(STAGES, "server").items() if k.startswith(ENV_PREFIX)}
    for key, value in service_env(service).items():
        if key.startswith(ENV_PREFIX) and value is not None:
            env[key] = interpolate(value)
    return env


@pytest.mark.parametrize("source", ["image", *reward_server_services()])
def test_server_environment_is_valid_configuration(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image's and compose's values load as settings: all interfaces, port 8000, /models."""
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    env = (
        {k: v for k, v in env_of(STAGES, "server").items() if k.startswith(ENV_PREFIX)}
        if source == "image"
        else _container_env(source)
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = ServerSettings()  # type: ignore[call-arg]  # model comes from the environment
    assert settings.host == "0.0.0.0"
    assert settings.port == 8000
    assert settings.model == "/models/reward"
    assert settings.api_key is None


def test_all_interfaces_only_inside_the_container() -> None:
    """The CLI binds loopback; only the server image (and its compose services) say 0.0.0.0."""
    assert ServerSettings.model_fields["host"].default == "127.0.0.1"
    for stage in STAGES:
        host = env_of(STAGES, stage).get(ENV_PREFIX + "HOST")
        assert host == ("0.0.0.0" if stage.startswith("server") else None), stage
    for name, service in SERVICES.items():
        if name not in reward_server_services():
            assert ENV_PREFIX + "HOST" not in service_env(name), name
        for port in service.get("ports", []):
            # Published on the host's loopback only: an open server is not reachable from
            # other machines unless the user asks for it.
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port}"


# ----------------------------------------------------------------------------------------
# Commands: console scripts, modules, and compose == image CMD


def _check_argv(argv: list[str], image_files: dict[str, str]) -> None:
    """argv runs a declared console script, ``python -m <module>`` or a copied script."""
    assert argv, "empty command"
    program = argv[0]
    if program in CONSOLE_SCRIPTS:
        package = CONSOLE_SCRIPTS[program].split(".")[0]
        assert (ROOT / package).is_dir(), f"{program}: package {package} is not in the repository"
        assert (BIN / program).exists(), f"{program} is not installed in the environment"
        return
    assert program in ("python", "python3"), f"{program} is neither a console script nor python"
    if argv[1] == "-m":
        module = argv[2]
        top = module.split(".")[0]
        assert (ROOT / top).is_dir(), f"{module}: package {top} is not in the repository"
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
        return
    script = argv[1]
    assert script in image_files, f"{script} is not copied into the image"
    assert (ROOT / image_files[script]).is_file(), image_files[script]


@pytest.mark.parametrize("target", IMAGE_TARGETS)
def test_image_commands_are_real(target: str) -> None:
    """CMD/ENTRYPOINT (and HEALTHCHECK) of each image run something that exists."""
    cmd = last(STAGES, target, "CMD")
    assert cmd is not None, f"{target} has no CMD"
    assert last(STAGES, target, "ENTRYPOINT") is None, "CMD alone keeps `docker run IMG cmd` easy"
    files = copies(STAGES, target)
    _check_argv(exec_form(cmd), files)
    check = last(STAGES, target, "HEALTHCHECK")
    if check is not None:
        _check_argv(healthcheck_argv(check), files)


def test_image_commands_are_the_documented_ones() -> None:
    """The server needs no flags (env only); the trainer reads /config/ppo.yaml."""
    assert exec_form(last(STAGES, "server", "CMD") or "") == ["reward-server"]
    assert exec_form(last(STAGES, "trainer", "CMD") or "") == [
        *("ppo-client", "train", "--config", "/config/ppo.yaml")
    ]


@pytest.mark.parametrize("service", built_services())
def test_compose_runs_what_the_image_says(service: str) -> None:
    """A service's command, entrypoint and health check equal its image target's."""
    svc = SERVICES[service]
    target = svc["build"]["target"]
    assert target in IMAGE_TARGETS
    assert svc["build"]["dockerfile"] == "docker/Dockerfile"
    assert svc["build"]["context"] == "."
    assert svc["command"] == exec_form(last(STAGES, target, "CMD") or "")
    assert "entrypoint" not in svc
    image_check = last(STAGES, target, "HEALTHCHECK")
    if "healthcheck" in svc:
        assert image_check is not None
        assert svc["healthcheck"]["test"] == ["CMD", *healthcheck_argv(image_check)]


def test_compose_demo_is_make_demo() -> None:
    """The demo profile runs the same entry point as `make demo`, offline."""
    demo = SERVICES["demo"]
    assert demo["profiles"] == ["demo"]
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "Makefile has no demo target"
    module = demo["command"][demo["command"].index("-m") + 1]
    assert f"-m {module}" in recipe.group(1)
    assert demo["network_mode"] == "none"


def test_observability_profile_runs_the_shipped_configuration() -> None:
    """The `observability` profile: Prometheus and Grafana, on pinned images, read the files of
    deploy/observability (which exist), Prometheus scrapes the reward-server service on the
    server port with the shipped alert rules, and Grafana's datasource is that Prometheus."""
    observability = {n for n, s in SERVICES.items() if s.get("profiles") == ["observability"]}
    assert observability == {"prometheus", "grafana"}
    for name in observability:
        image = SERVICES[name]["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        for mount in mounts(name):
            if str(mount["source"]).startswith("./"):
                assert (ROOT / mount["source"]).exists(), f"{name}: {mount['source']} is missing"
                assert mount.get("read_only"), f"{name}: {mount['target']} is writable"
    prometheus = {m["target"]: m["source"] for m in mounts("prometheus")}
    config_path = next(
        a.split("=", 1)[1] for a in SERVICES["prometheus"]["command"] if "config" in a
    )
    config = yaml.safe_load((ROOT / prometheus[config_path]).read_text(encoding="utf-8"))
    for rule_file in config["rule_files"]:
        in_container = posixpath.join(posixpath.dirname(config_path), rule_file)
        assert prometheus[in_container] == "./deploy/observability/alerts.yml"
    port = env_of(STAGES, "server")[ENV_PREFIX + "PORT"]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "reward-server" and job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": [f"reward-server:{port}"]}]
    grafana = {m["target"]: m["source"] for m in mounts("grafana")}
    provisioning = ROOT / grafana["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090" and "9090" in str(
        SERVICES["prometheus"]["ports"][0]
    )
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "reward-server.yml").read_text())[
        "providers"
    ]
    folder = provider["options"]["path"]
    dashboards = [t for t in grafana if posixpath.dirname(t) == folder]
    assert [grafana[t] for t in dashboards] == ["./deploy/observability/grafana/reward-server.json"]


@pytest.mark.parametrize("script", sorted(CONSOLE_SCRIPTS))
def test_console_scripts_answer_help(script: str) -> None:
    """The console scripts the images run start and print their usage."""
    argv = [str(BIN / script), "--help"] if script == "reward-server" else []
    if script == "ppo-client":
        argv = [str(BIN / script), "train", "--help"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    if script == "ppo-client":
        assert "--config" in result.stdout


# ----------------------------------------------------------------------------------------
# Users, mounts, dependencies, replicas


@pytest.mark.parametrize("target", IMAGE_TARGETS)
def test_images_run_as_non_root(target: str) -> None:
    """The last USER of each image is an unprivileged uid, after every root-only step."""
    user = last(STAGES, target, "USER")
    assert user is not None, f"{target} runs as root"
    uid = user.split(":")[0]
    assert uid not in ("root", "0"), user
    assert uid.isdigit() and int(uid) >= 1000, f"use a numeric uid >= 1000, got {user}"
    steps = [instr for instr, _ in instructions(STAGES, target)]
    final_user = len(steps) - 1 - steps[::-1].index("USER")
    assert "RUN" not in steps[final_user:], "nothing may run as root after the final USER"


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_services_do_not_escalate(service: str) -> None:
    """No service overrides the image's user or gets privileges."""
    svc = SERVICES[service]
    assert str(svc.get("user", "10001")).split(":")[0] not in ("root", "0")
    assert not svc.get("privileged", False)
    assert svc.get("cap_drop") == ["ALL"]
    assert "no-new-privileges:true" in svc.get("security_opt", [])


def test_server_healthcheck_and_port() -> None:
    """The server image probes /health with the copied script and exposes the server port."""
    check = last(STAGES, "server", "HEALTHCHECK")
    assert check is not None, "server image has no HEALTHCHECK"
    argv = healthcheck_argv(check)
    assert copies(STAGES, "server")[argv[1]] == "docker/healthcheck.py"
    assert "/health" in (DOCKER_DIR / "healthcheck.py").read_text()
    assert last(STAGES, "server", "EXPOSE") == env_of(STAGES, "server")[ENV_PREFIX + "PORT"]
    for name in reward_server_services():
        assert "healthcheck" in SERVICES[name]


@pytest.mark.parametrize("service", reward_server_services())
def test_model_folder_is_mounted_read_only(service: str) -> None:
    """REWARD_SERVER_MODEL's default lies inside a read-only mount."""
    model = _container_env(service)[ENV_PREFIX + "MODEL"]
    holders = [m for m in mounts(service) if model.startswith(m["target"].rstrip("/") + "/")]
    assert holders, f"{model} is not inside any mount of {service}"
    assert all(m.get("read_only") for m in holders)
    hf_home = env_of(STAGES, "server")["HF_HOME"]
    assert any(m["target"] == hf_home for m in mounts(service)), "hub downloads not kept"


def test_trainer_waits_for_healthy_servers() -> None:
    """The trainer starts once every reward-server service it may use is healthy."""
    trainer = SERVICES["trainer"]
    depends = trainer["depends_on"]
    servers = reward_server_services()
    assert set(servers) <= set(depends)
    for name in servers:
        assert depends[name]["condition"] == "service_healthy"
        optional = "profiles" in SERVICES[name]
        # A replica in a profile is waited for only when that profile is active.
        assert depends[name].get("required", True) is (not optional), name
    mounted = {m["target"]: m for m in mounts("trainer")}
    assert mounted["/config/ppo.yaml"]["read_only"]
    assert "/app/runs" in mounted and last(STAGES, "trainer", "WORKDIR") == "/app"


def _check_reward_urls(value: str) -> set[str]:
    """Each URL of a comma-separated REWARD_URL names a server service on the server port."""
    port = int(env_of(STAGES, "server")[ENV_PREFIX + "PORT"])
    hosts = set()
    for url in value.split(","):
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.port == port and parts.path in ("", "/"), url
        assert parts.hostname in reward_server_services(), f"{url}: no such server service"
        hosts.add(parts.hostname)
    return hosts


def test_reward_url_points_at_the_server() -> None:
    """The trainer's default REWARD_URL is the compose reward-server service."""
    value = interpolate(service_env("trainer")["REWARD_URL"])
    assert _check_reward_urls(value) == {"reward-server"}
    assert interpolate(service_env("trainer")["REWARD_API_KEY"]) == ""  # unset: no key


def test_documented_replicas_resolve() -> None:
    """The documented multi-replica REWARD_URL names every replica, and they are identical."""
    documented = documented_reward_urls()
    assert documented, "compose.yaml documents no replica REWARD_URL"
    for value in documented:
        assert _check_reward_urls(value) == set(reward_server_services())
    primary = SERVICES["reward-server"]
    for name in reward_server_services():
        if name == "reward-server":
            continue
        replica = SERVICES[name]
        assert replica["profiles"] == ["replicas"]
        assert "ports" not in replica  # one host port; replicas are reached in-network
        strip = ("ports", "profiles")
        assert {k: v for k, v in replica.items() if k not in strip} == {
            k: v for k, v in primary.items() if k not in strip
        }


# ----------------------------------------------------------------------------------------
# Build arguments and context


def test_build_args_match_dockerfile_and_makefile() -> None:
    """compose's build-arg defaults are the Dockerfile's, and torch is the Makefile's pin."""
    arg_defaults = dict(GLOBAL_ARGS)
    for instr, args in instructions(STAGES, "base"):
        if instr == "ARG":
            key, _, default = args.partition("=")
            arg_defaults[key] = default
    for name, service in SERVICES.items():
        for key, value in service.get("build", {}).get("args", {}).items():
            assert interpolate(value) == arg_defaults[key], f"{name}: {key}"
    pin = re.search(r"^TORCH \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert pin and arg_defaults["TORCH_VERSION"] == pin.group(1)
    assert arg_defaults["TORCH_INDEX_URL"].endswith("/whl/cpu")  # CPU unless asked


def _dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves ``path`` out (last matching pattern wins)."""

    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                out, i = out + pattern[i : end + 1], end + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out)

    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        if any(regex(body).fullmatch(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def test_build_context_has_what_the_images_copy() -> None:
    """.dockerignore keeps every COPY source and leaves out the venv, git, runs and caches."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for target in STAGES:  # the images and the stages they copy from (the wheel's sources)
        for source in copies(STAGES, target).values():
            path = ROOT / source
            files = [path] if path.is_file() else list(path.rglob("*.py"))
            assert files, f"{source} is missing"
            for file in files:
                rel = file.relative_to(ROOT).as_posix()
                if "__pycache__" not in rel:
                    assert not _dockerignore_excludes(rel, patterns), rel
    readme = PYPROJECT["project"]["readme"]
    assert copies(STAGES, "base")["/opt/build/" + readme] == readme  # pip needs it
    for left_out in (
        ".venv/bin/python",
        ".git/HEAD",
        "runs/demo/metrics.jsonl",
        "models/reward/model.safetensors",
        "tests/conftest.py",
        "reward_server/__pycache__/app.cpython-311.pyc",
        ".env",
    ):
        assert _dockerignore_excludes(left_out, patterns), left_out


def test_project_installs_from_the_copied_files(tmp_path: Path) -> None:
    """A wheel builds from exactly what the wheel stage copies, with every package and both
    console scripts."""
    build_dir = last(STAGES, WHEEL_STAGE, "WORKDIR")
    assert build_dir is not None
    build_dir = build_dir.rstrip("/") + "/"
    for image_path, source in copies(STAGES, WHEEL_STAGE).items():
        if not image_path.startswith(build_dir):
            continue
        dest = tmp_path / image_path[len(build_dir) :]
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / source, dest)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    result = subprocess.run(
        [*cmd, "-w", str(tmp_path / "dist"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    for script, target in CONSOLE_SCRIPTS.items():
        assert f"{script} = {target}" in scripts
        module = target.split(":")[0].replace(".", "/") + ".py"
        assert module in names
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [
        path.name
        for path in ROOT.iterdir()
        if (path / "__init__.py").is_file() and any(fnmatch.fnmatch(path.name, p) for p in include)
    ]
    assert "reward_client" in packages
    for package in packages:
        assert f"{package}/__init__.py" in names, f"{package} is not copied into the wheel stage"


def test_trainer_config_default_exists() -> None:
    """The run configuration compose mounts by default is in the repository."""
    source = next(m["source"] for m in mounts("trainer") if m["target"] == "/config/ppo.yaml")
    path = ROOT / interpolate(source)
    assert path.is_file(), f"{path.relative_to(ROOT)} (the trainer's default config) is missing"
    config = yaml.safe_load(path.read_text())
    assert isinstance(config, dict) and "model_name_or_path" in config
    # The trainer's working directory is /app and the `runs` volume is /app/runs.
    assert str(config.get("output_dir", "")).startswith("runs/"), "write into the runs volume"


def _load_pyproject_deps() -> Any:
    """docker/pyproject_deps.py as a module (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location(
        "pyproject_deps", DOCKER_DIR / "pyproject_deps.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pyproject_deps = _load_pyproject_deps()


def _names(lines: list[str]) -> set[str]:
    """The canonical project names of requirement lines."""
    return {canonicalize_name(Requirement(line).name) for line in lines}


def test_pyproject_deps_script() -> None:
    """The dependency-layer helper prints pyproject's requirements, self-references expanded."""
    script = [sys.executable, str(DOCKER_DIR / "pyproject_deps.py"), str(ROOT / "pyproject.toml")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [*script, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    base = run()
    assert base.returncode == 0, base.stderr
    assert base.stdout.splitlines() == PYPROJECT["project"]["dependencies"]
    optional = PYPROJECT["project"]["optional-dependencies"]
    server = run("--extra", "server", "--no-base")
    assert server.stdout.splitlines() == optional["server"]
    # demo = ["remote-reward[server,ppo]", ...]: server's, then ppo's new lines, then its own.
    demo = run("--extra", "demo", "--no-base")
    assert demo.returncode == 0, demo.stderr
    expected = list(optional["server"])
    expected += [line for line in optional["ppo"] if line not in expected]
    expected += [line for line in optional["demo"] if not line.startswith("remote-reward[")]
    assert demo.stdout.splitlines() == expected
    assert run("--extra", "no-such-extra").returncode != 0


@pytest.mark.parametrize("extra", sorted(PYPROJECT["project"].get("optional-dependencies", {})))
def test_pyproject_deps_never_asks_for_the_project(extra: str) -> None:
    """No extra's requirement list names remote-reward (pip would fetch it from an index),
    and each holds its own other requirements and those of the extras it names."""
    project = PYPROJECT["project"]
    lines = pyproject_deps.requirements(ROOT / "pyproject.toml", [extra], base=False)
    assert len(lines) == len(set(lines))
    assert canonicalize_name(project["name"]) not in _names(lines)
    for line in project["optional-dependencies"][extra]:
        req = Requirement(line)
        if canonicalize_name(req.name) == canonicalize_name(project["name"]):
            for named in req.extras:
                inner = pyproject_deps.requirements(ROOT / "pyproject.toml", [named], base=False)
                assert set(inner) <= set(lines), named
        else:
            assert line in lines


SELF_REFERENCING = """
[project]
name = "My_Project"
version = "0"
dependencies = ["httpx>=0.27"]

[project.optional-dependencies]
server = ["torch>=2.4", "fastapi"]
ppo = ["torch>=2.4", "datasets"]
vllm = ["my-project[server]", "vllm>=0.11"]
all = ["my.project[ppo, vllm]", "ray[serve]>=2.47"]
gpu = ["my-project[server]; sys_platform == 'linux'", "nvidia-x; python_version >= '3.10'"]
Loop_A = ["my-project[loop-b]", "a"]
loop-b = ["my-project[loop_a]", "b"]
broken = ["my-project[nope]"]
"""


def test_pyproject_deps_expands_self_references(tmp_path: Path) -> None:
    """`project[x,y]` in an extra becomes x's and y's requirements: recursively, once each,
    in order, names normalised, a marker carried onto what it brings, cycles ended."""
    path = tmp_path / "pyproject.toml"
    path.write_text(SELF_REFERENCING)

    def reqs(*extras: str, base: bool = False) -> list[str]:
        return pyproject_deps.requirements(path, list(extras), base=base)

    assert reqs("vllm") == ["torch>=2.4", "fastapi", "vllm>=0.11"]
    assert reqs("all", base=True) == [
        *("httpx>=0.27", "torch>=2.4", "datasets", "fastapi", "vllm>=0.11", "ray[serve]>=2.47")
    ]
    assert reqs("server", "vllm") == reqs("vllm")  # nothing twice
    assert reqs("gpu") == [
        'torch>=2.4; sys_platform == "linux"',
        'fastapi; sys_platform == "linux"',
        "nvidia-x; python_version >= '3.10'",
    ]
    assert reqs("loop-a") == ["b", "a"]
    assert reqs("LOOP.B") == ["a", "b"]
    with pytest.raises(SystemExit, match="nope"):
        reqs("broken")
    with pytest.raises(SystemExit, match="missing"):
        reqs("missing")
    # The command line prints the same lines.
    cmd = [sys.executable, str(DOCKER_DIR / "pyproject_deps.py"), str(path), "--extra", "all"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == reqs("all", base=True)


def _image_extras(target: str) -> list[str]:
    """The pyproject extras a target's RUN steps install (ARG defaults substituted)."""
    args: dict[str, str] = dict(GLOBAL_ARGS)
    extras: list[str] = []
    for instr, line in instructions(STAGES, target):
        if instr == "ARG":
            key, _, default = line.partition("=")
            args[key] = default
        elif instr == "RUN" and "pyproject_deps.py" in line:
            line = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], line)
            extras += [e.strip("\"'") for e in re.findall(r"--extra\s+(\S+)", line)]
    return extras


# The extras each image needs: what its command runs (the demo runs a server and a trainer).
IMAGE_EXTRAS = {
    "server": ["server"],
    "server-vllm": ["server", "vllm"],
    "server-code": ["server"],
    "trainer": ["ppo", "plot"],
    "demo": ["server", "ppo", "demo"],
}


@pytest.mark.parametrize("target", IMAGE_TARGETS)
def test_images_install_the_extras_they_run(target: str) -> None:
    """Each image installs its extras' requirements (and no other image's), then the wheel."""
    pyproject = ROOT / "pyproject.toml"
    installed = _names(pyproject_deps.requirements(pyproject, _image_extras(target)))
    needed = _names(pyproject_deps.requirements(pyproject, IMAGE_EXTRAS[target]))
    assert needed <= installed, f"{target} lacks {sorted(needed - installed)}"
    server = _names(pyproject_deps.requirements(pyproject, ["server"]))
    ppo = _names(pyproject_deps.requirements(pyproject, ["ppo"]))
    if "server" not in IMAGE_EXTRAS[target]:
        assert not (server - ppo) & installed, f"{target} installs the server's dependencies"
    if "ppo" not in IMAGE_EXTRAS[target]:
        assert not (ppo - server) & installed, f"{target} installs the trainer's dependencies"
    # The project's wheel (built by the wheel stage from the copied packages), with
    # --no-deps, after the image's extras layer, so a code change keeps that layer.
    # (server-vllm adds vLLM on top of the finished server image.)
    steps = instructions(STAGES, target)
    extras_at = min(
        i for i, (instr, a) in enumerate(steps) if "pyproject_deps.py" in a and "--extra" in a
    )
    later = steps[extras_at:]
    copied = [a for instr, a in later if instr == "COPY" and f"--from={WHEEL_STAGE} " in a]
    assert copied, f"{target} does not copy the project's wheel after its extras"
    installs = [a for instr, a in later if instr == "RUN" and "pip install" in a]
    assert any("--no-deps" in a and ".whl" in a for a in installs), installs


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports only a type checker runs."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _guards_import(node: ast.AST) -> bool:
    """``try: import x`` ``except ImportError``: an import the code does without."""
    if not isinstance(node, ast.Try):
        return False
    for handler in node.handlers:
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(
            isinstance(c, ast.Name) and c.id in ("ImportError", "ModuleNotFoundError")
            for c in caught
        ):
            return True
    return False


def _imports(node: ast.AST, found: set[str]) -> None:
    """Top-level module names ``node`` imports, at module level or inside functions."""
    if isinstance(node, ast.Import):
        found.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        found.add(node.module.split(".")[0])
    skipped = set()
    if _is_type_checking(node) or _guards_import(node):
        skipped = {id(statement) for statement in node.body}  # type: ignore[attr-defined]
    for child in ast.iter_child_nodes(node):
        if id(child) not in skipped:
            _imports(child, found)


def third_party_imports(paths: list[Path]) -> dict[str, list[str]]:
    """Import name -> the files importing it, for every module that is not the standard
    library's or this repository's own."""
    own = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    own |= {p.stem for p in ROOT.glob("*.py")} | {"__future__"}
    result: dict[str, list[str]] = {}
    for path in paths:
        found: set[str] = set()
        _imports(ast.parse(path.read_text(encoding="utf-8")), found)
        for name in found - own - set(sys.stdlib_module_names):
            result.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    return result


def test_import_scan_sees_lazy_imports_and_skips_optional_ones() -> None:
    """The scan behind the next test: imports in functions count; type-checking-only ones and
    those behind ``except ImportError`` do not (their ``else`` and handlers still do)."""
    source = """
from typing import TYPE_CHECKING
import a.b
from c import d
from . import relative
if TYPE_CHECKING:
    import typing_only
else:
    import not_type_checking
try:
    import optional
except ImportError:
    import fallback
def f():
    import lazy
class K:
    from e.f import g
"""
    found: set[str] = set()
    _imports(ast.parse(source), found)
    assert found == {"typing", "a", "c", "not_type_checking", "fallback", "lazy", "e"}


# The code each image runs (the demo: examples/demo*.py and tiny_models.py, beside both).
IMAGE_CODE = {
    "server": ["reward_client", "reward_server", "settings_cli"],
    "server-vllm": ["reward_client", "reward_server", "settings_cli"],
    "server-code": ["reward_client", "reward_server", "settings_cli"],
    "trainer": ["reward_client", "ppo_client", "settings_cli"],
    "demo": [
        "reward_client",
        "reward_server",
        "ppo_client",
        "settings_cli",
        "examples/demo*.py",
        "tiny_models.py",
    ],
}
# Imported only by a feature that comes with an extra the image leaves out on purpose.
OPTIONAL_IMPORTS = {
    "server": {"vllm"},  # --engine vllm: the server-vllm image
    "server-code": {"vllm"},
    "trainer": {"vllm"},  # rollout_engine: vllm (pip install 'remote-reward[vllm]')
    "demo": {"vllm"},
}


@pytest.mark.parametrize("target", IMAGE_TARGETS)
def test_images_hold_what_their_code_imports(target: str) -> None:
    """Every third-party module the image's code imports (at module level or in a function,
    unless only for type checking or behind ``except ImportError``) comes with the
    requirements the image installs."""
    paths: list[Path] = []
    for item in IMAGE_CODE[target]:
        paths += sorted((ROOT / item).rglob("*.py")) if (ROOT / item).is_dir() else ROOT.glob(item)
    lines = pyproject_deps.requirements(ROOT / "pyproject.toml", _image_extras(target))
    installed = set(dependency_closure(lines, strict=False))
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for name, files in sorted(third_party_imports(paths).items()):
        if name in OPTIONAL_IMPORTS.get(target, set()):
            continue
        dists = {canonicalize_name(d) for d in providers.get(name, [])} | {canonicalize_name(name)}
        if not dists & installed:
            missing[name] = files
    assert not missing, f"the {target} image installs nothing that provides: {missing}"


# ----------------------------------------------------------------------------------------
# The image's health probe, against a scripted HTTP server and against the real server


def _probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run docker/healthcheck.py the way the image does, with ``env`` as the container env."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    full_env.update(env)
    full_env["HTTP_PROXY"] = full_env["http_proxy"] = "http://127.0.0.1:9"  # must be bypassed
    cmd = [sys.executable, str(DOCKER_DIR / "healthcheck.py")]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=60)


class _Health(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's current status and records the path."""

    status = 200
    paths: list[str] = []  # noqa: RUF012  # shared by the test and the handler thread

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def scripted_health() -> Iterator[tuple[type[_Health], int]]:
    """A loopback HTTP server whose /health status the test sets."""
    handler = type("Handler", (_Health,), {"status": 200, "paths": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_healthcheck_follows_status(scripted_health: tuple[type[_Health], int]) -> None:
    """200 on /health is healthy; 503 (loading or draining) and a closed port are not."""
    handler, port = scripted_health
    env = {ENV_PREFIX + "HOST": "0.0.0.0", ENV_PREFIX + "PORT": str(port)}
    ok = _probe(env)
    assert ok.returncode == 0, ok.stderr
    assert handler.paths == ["/health"]
    handler.status = 503
    loading = _probe(env)
    assert loading.returncode == 1
    assert "503" in loading.stderr
    closed = _probe({ENV_PREFIX + "PORT": str(server_proc.free_port())})
    assert closed.returncode == 1
    assert "unhealthy" in closed.stderr


def test_healthcheck_url_for_bind_addresses() -> None:
    """Wildcard bind addresses are probed on loopback; explicit ones as given."""
    spec = importlib.util.spec_from_file_location("healthcheck", DOCKER_DIR / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    healthcheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(healthcheck)
    assert healthcheck.health_url({}) == "http://127.0.0.1:8000/health"
    assert healthcheck.health_url({"REWARD_SERVER_HOST": "0.0.0.0"}).startswith("http://127.0.0.1:")
    assert healthcheck.health_url({"REWARD_SERVER_HOST": "::"}) == "http://[::1]:8000/health"
    assert (
        healthcheck.health_url({"REWARD_SERVER_HOST": "10.0.0.5", "REWARD_SERVER_PORT": "9000"})
        == "http://10.0.0.5:9000/health"
    )


def test_env_only_server_passes_the_image_healthcheck(bert_rm: Path, tmp_path: Path) -> None:
    """`reward-server` with no flags, configured like the container, answers the image probe.

    The container's environment (image ENV, then compose's) is used as is, except the model
    (the tiny BERT stands in for the mounted /models/reward) and a free loopback port.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(_container_env("reward-server"))
    env.update(
        {
            ENV_PREFIX + "MODEL": str(bert_rm),
            ENV_PREFIX + "HOST": "127.0.0.1",
            ENV_PREFIX + "PORT": str(server_proc.free_port()),
            "PYTHONUNBUFFERED": "1",
        }
    )
    argv = [
        str(BIN / a) if i == 0 else a for i, a in enumerate(SERVICES["reward-server"]["command"])
    ]
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while _probe(env).returncode != 0:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "server never became healthy"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # what `docker stop` sends
        assert proc.wait(timeout=60) == 0
        assert _probe(env).returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


# ----------------------------------------------------------------------------------------
# Code rewards: the server-code image


#: The Debian package that brings each toolchain the sandbox's languages run (Python is the
#: base image's own interpreter).
TOOL_PACKAGES = {"g++": "g++", "gcc": "gcc", "node": "nodejs"}


def test_server_code_image_has_the_toolchains_of_its_languages() -> None:
    """Every tool the code-rewards component's languages need is an apt package the
    server-code image installs (as root, before its final unprivileged USER), on top of the
    server image (whose server extra brings bwrap)."""
    models = ROOT / "deploy" / "kubernetes" / "components" / "code-rewards" / "models.yaml"
    (code,) = [m for m in parse_models_file(yaml.safe_load(models.read_text())).models]
    tools = {tool for name in code.languages for tool in language(name).tools()}
    tools.discard("{python}")
    installs = " ".join(
        args
        for instr, args in STAGES["server-code"].instructions
        if instr == "RUN" and "apt-get install" in args
    )
    packages = set(re.findall(r"(?<![-\w])([a-z][\w.+-]*)", installs.split("install", 1)[-1]))
    assert {TOOL_PACKAGES[tool] for tool in tools} <= packages, (tools, packages)
    assert stage_chain(STAGES, "server-code")[-2].name == "server"
