"""`pip install remote-reward` is the reward client alone: httpx and nothing heavy.

The acceptance test of the light client. A fresh virtual environment (the interpreter the
project's venv was made from, without any of its packages) gets the project's wheel with no
extras, its dependencies from the package index as a user's would. There, what is installed
is exactly remote-reward and httpx's dependency closure (computed from the installed
metadata, not written down), every module of ``reward_client`` imports (the TRL, verl and
OpenRLHF integrations included) without torch, transformers, TRL or FastAPI being
installed, and the client scores texts on a real ``reward-server`` (run from the project's
venv) the same as the client of the full install does.

The wheel is built once from a copy of the files setuptools reads (the repository is shared
and its tree is not written to), and pip's cache is left on, so the module takes seconds.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from dependency_closure import dependency_closure
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from server_proc import ServerProcess

from tiny_models import make_corpus

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DISTRIBUTION = canonicalize_name(PYPROJECT["project"]["name"])
PACKAGE = "reward_client"
# Modules that must be there: the integrations import their framework only when used.
REQUIRED_MODULES = (
    f"{PACKAGE}.integrations.trl",
    f"{PACKAGE}.integrations.verl",
    f"{PACKAGE}.integrations.openrlhf",
)
# What the server, the trainer and the engines need; none of it may come with the client.
# Distribution and import names are the same for all of them.
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "fastapi",
    "starlette",
    "pydantic",
    "uvicorn",
    "numpy",
    "datasets",
    "accelerate",
    "peft",
)
# What `python -m venv` itself puts into a fresh environment (ensurepip), depending on Python.
VENV_TOOLS = frozenset({"pip", "setuptools", "wheel"})
TIMEOUT = 300


# ----------------------------------------------------------------------------------------
# The expected set: the base dependencies of pyproject.toml and their closure.

BASE_REQUIREMENTS: list[str] = PYPROJECT["project"]["dependencies"]
CLOSURE = dependency_closure(BASE_REQUIREMENTS)


# ----------------------------------------------------------------------------------------
# The fresh environment, made once for the module.


@dataclass
class LightVenv:
    """A venv with the project installed without extras."""

    root: Path
    python: Path
    installed: dict[str, str]  # canonical name -> version (`pip list`)
    pip_log: str

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``python -I *args`` in the venv (isolated: no PYTHONPATH, user site or cwd)."""
        return _run([str(self.python), "-I", *args], cwd=self.root, timeout=timeout)

    def run_json(self, script: str, *args: str) -> object:
        """Run ``script`` with ``args`` in the venv and parse the last line it prints."""
        result = self.run("-c", script, *args)
        assert result.returncode == 0, result.stdout + result.stderr
        return json.loads(result.stdout.splitlines()[-1])


def _clean_env() -> dict[str, str]:
    """This process's environment without what would leak the full venv into the fresh one."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _run(
    cmd: list[str], *, cwd: Path, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )


def _base_python() -> str:
    """The interpreter the running venv was created from (``sys.base_prefix``)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        Path(sys.base_prefix) / "bin" / version,
        Path(sys.base_prefix) / "bin" / "python3",
    ):
        if candidate.is_file():
            return str(candidate)
    return sys.executable  # `python -m venv` from a venv python still makes a bare venv


def _copy_sources(dest: Path) -> None:
    """The files setuptools reads to build the wheel: pyproject, readme, licence, packages."""
    dest.mkdir()
    names = ["pyproject.toml", PYPROJECT["project"]["readme"], "MANIFEST.in", "setup.py"]
    for pattern in ("LICEN[CS]E*", "COPYING*", "NOTICE*", "AUTHORS*"):
        names += [p.name for p in ROOT.glob(pattern)]
    for name in names:
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, dest / name)
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for path in sorted(ROOT.iterdir()):
        if (
            path.is_dir()
            and (path / "__init__.py").is_file()
            and any(fnmatch.fnmatch(path.name, pattern) for pattern in include)
        ):
            shutil.copytree(path, dest / path.name, ignore=ignore)


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> LightVenv:
    """Build the wheel once (in the project's venv), install it into a bare venv, no extras."""
    work = tmp_path_factory.mktemp("light_client")
    source = work / "source"
    _copy_sources(source)
    dist = work / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    build = _run([*pip_wheel, "-q", "-w", str(dist), str(source)], cwd=work)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("*.whl")

    venv = work / "venv"
    made = _run([_base_python(), "-m", "venv", str(venv)], cwd=work, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    python = venv / "bin" / "python"

    # The closure's versions from the full environment as constraints: the fresh venv gets
    # what the allow-list was computed from (from pip's cache or the index), nothing newer.
    constraints = work / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in CLOSURE.items()))
    pip_install = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    install = _run(
        [*pip_install, "--no-input", "--only-binary", ":all:", "-c", str(constraints), str(wheel)],
        cwd=work,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    listed = _run([str(python), "-m", "pip", "list", "--format=json"], cwd=work)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    installed = {
        canonicalize_name(item["name"]): item["version"] for item in json.loads(listed.stdout)
    }
    return LightVenv(work, python, installed, install.stdout + install.stderr)


def _describe(installed: dict[str, str]) -> str:
    return ", ".join(f"{name}=={version}" for name, version in sorted(installed.items()))


# ----------------------------------------------------------------------------------------
# 1. What gets installed


def test_base_dependency_is_httpx_alone() -> None:
    """pyproject.toml's base dependencies are httpx: everything else is an extra."""
    assert {canonicalize_name(Requirement(r).name) for r in BASE_REQUIREMENTS} == {"httpx"}
    assert not set(CLOSURE) & {canonicalize_name(h) for h in HEAVY}, CLOSURE


def test_install_is_the_client_and_httpx_closure(light_venv: LightVenv) -> None:
    """The fresh venv holds remote-reward, httpx's closure and the venv's own tools only."""
    installed = light_venv.installed
    listing = f"installed: {_describe(installed)}\npip said:\n{light_venv.pip_log}"
    heavy = {canonicalize_name(h) for h in HEAVY} & set(installed)
    assert not heavy, f"heavy packages came with the client: {sorted(heavy)}\n{listing}"
    allowed = {DISTRIBUTION, *CLOSURE, *VENV_TOOLS}
    assert set(installed) <= allowed, (
        f"not in the allow-list: {set(installed) - allowed}\n{listing}"
    )
    missing = {DISTRIBUTION, *CLOSURE} - set(installed)
    assert not missing, f"missing: {sorted(missing)}\n{listing}"
    assert installed[DISTRIBUTION] == PYPROJECT["project"]["version"]
    print(f"light client venv: {_describe(installed)}")


# ----------------------------------------------------------------------------------------
# 2. Every module of the client imports there

_IMPORT_ALL = """
import importlib, importlib.util, json, pkgutil, sys
package, heavy = sys.argv[1], sys.argv[2].split(",")
errors = {}
top = importlib.import_module(package)
modules = [package]
def failed(name):
    errors[name] = repr(sys.exc_info()[1])
for info in pkgutil.walk_packages(top.__path__, package + ".", onerror=failed):
    modules.append(info.name)
    if info.name.endswith(".__main__"):
        continue  # importing it would run the program
    try:
        importlib.import_module(info.name)
    except BaseException as exc:
        errors[info.name] = repr(exc)
print(json.dumps({
    "file": top.__file__,
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "modules": modules,
    "errors": errors,
    "loaded": sorted(m for m in heavy if m in sys.modules),
    "importable": sorted(m for m in heavy if importlib.util.find_spec(m) is not None),
}))
"""


def test_every_client_module_imports_without_heavy_packages(light_venv: LightVenv) -> None:
    """``reward_client`` and each of its modules import; nothing heavy is there to import."""
    report = light_venv.run_json(_IMPORT_ALL, PACKAGE, ",".join(HEAVY))
    assert isinstance(report, dict)
    venv = light_venv.python.parent.parent
    assert Path(report["prefix"]) == venv
    assert Path(report["base_prefix"]).resolve() == Path(sys.base_prefix).resolve()
    # The installed copy, not the repository's tree.
    assert Path(report["file"]).resolve().is_relative_to(venv.resolve()), report["file"]
    assert not report["errors"], json.dumps(report["errors"], indent=1)
    missing = set(REQUIRED_MODULES) - set(report["modules"])
    assert not missing, f"not in {PACKAGE}: {sorted(missing)}; found {report['modules']}"
    assert report["importable"] == [], report["importable"]
    assert report["loaded"] == []
    print(f"imported in the light venv: {', '.join(report['modules'])}")


# ----------------------------------------------------------------------------------------
# 3. It scores on a real server, like the full install's client

_SCORE = """
import asyncio, json, sys
from reward_client import AsyncRewardClient, RewardClient
url, texts = sys.argv[1], json.loads(sys.argv[2])
with RewardClient(url) as client:
    scores = client.score(texts=texts)
    detailed = client.score_detailed(texts=texts)
async def main():
    async with AsyncRewardClient(url) as client:
        return await client.score(texts=texts)
print(json.dumps({
    "scores": scores,
    "detailed": detailed.scores,
    "tokens": detailed.tokens,
    "async": asyncio.run(main()),
    "loaded": sorted(m for m in sys.argv[3].split(",") if m in sys.modules),
}))
"""


def test_light_client_scores_like_the_full_one(
    light_venv: LightVenv, gpt2_server: ServerProcess
) -> None:
    """One finite float per text from a real server, equal to the full install's scores."""
    from reward_client import RewardClient

    texts = make_corpus(8, seed=7)
    light = light_venv.run_json(_SCORE, gpt2_server.url, json.dumps(texts), ",".join(HEAVY))
    with RewardClient(gpt2_server.url) as client:
        full = client.score(texts=texts)
        full_tokens = client.score_detailed(texts=texts).tokens
    assert isinstance(light, dict)
    for key in ("scores", "detailed", "async"):
        scores = light[key]
        assert len(scores) == len(texts), key
        assert all(isinstance(s, float) and math.isfinite(s) for s in scores), (key, scores)
        # Invariant 1: equal within 1e-5 in float32, whatever the batch.
        assert scores == pytest.approx(full, abs=1e-5), key
    assert light["tokens"] == full_tokens
    assert light["loaded"] == []
