"""reward_client is light: every module of it imports with httpx and the standard library.

A verl, OpenRLHF or TRL environment installs ``remote-reward`` without extras and gets
httpx alone; the integrations import their framework only inside the functions that use
it. Each check runs in a fresh interpreter whose import system refuses the heavy packages,
so a stray top-level ``import torch`` anywhere in the package fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What a client-only environment does not have (or must not pay for).
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "fastapi",
    "starlette",
    "pydantic",
    "numpy",
    "verl",
    "openrlhf",
    "accelerate",
    "datasets",
    "peft",
    "vllm",
    "ray",
    "yaml",
    "reward_server",
    "ppo_client",
)

IMPORT_ALL = """
import importlib, importlib.abc, json, pkgutil, sys

HEAVY = set(json.loads(sys.argv[1]))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"{name} is refused: reward_client must not need it")
        return None

sys.meta_path.insert(0, Refuse())
import reward_client
names = ["reward_client"]
for info in pkgutil.walk_packages(reward_client.__path__, "reward_client."):
    importlib.import_module(info.name)
    names.append(info.name)
loaded = sorted({m.split(".")[0] for m in sys.modules} & HEAVY)
print(json.dumps({"modules": names, "heavy": loaded}))
"""


def run_light(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_every_module_imports_without_the_heavy_packages() -> None:
    result = run_light(IMPORT_ALL)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["heavy"] == []
    modules = set(report["modules"])
    expected = {
        "reward_client.client",
        "reward_client.flows",
        "reward_client.wire.vllm",
        "reward_client.integrations.trl",
        "reward_client.integrations.verl",
        "reward_client.integrations.openrlhf",
        "reward_client.integrations.verifiers",
    }
    assert expected <= modules, expected - modules
    # Every module file was imported (walk_packages found them all).
    files = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "reward_client").rglob("*.py")
    }
    assert files == modules


def test_the_blocker_refuses() -> None:
    """The check can fail: a module that imports torch is refused."""
    result = run_light(IMPORT_ALL.replace("import reward_client\n", "import torch\n", 1))
    assert result.returncode != 0
    assert "torch is refused" in result.stderr


def test_the_client_scores_and_the_openrlhf_function_answers_without_torch() -> None:
    """Not only importable: a call goes through (a mock transport) and OpenRLHF's reward
    function answers with plain lists where torch is missing."""
    code = (
        IMPORT_ALL
        + """
import httpx
from reward_client import RewardClient
from reward_client.integrations import openrlhf

def answer(request):
    if request.url.path == "/info":
        return httpx.Response(200, json={"max_client_batch": 2})
    texts = json.loads(request.content)["texts"]
    return httpx.Response(
        200,
        json={"scores": [len(t) for t in texts], "tokens": [1] * len(texts),
              "truncated": [False] * len(texts)},
    )

http = httpx.Client(transport=httpx.MockTransport(answer))
with RewardClient("http://rm:8000", http_client=http) as client:
    assert client.score(texts=["a", "bb", "ccc"]) == [1.0, 2.0, 3.0]
openrlhf._clients.blocking = lambda settings: RewardClient("http://rm:8000", http_client=http)
out = openrlhf.reward_func(["abcd"], ["ab"], [None], reward_url="http://rm:8000")
assert out["rewards"] == [4.0] and out["scores"] == [4.0], out
assert out["extra_logs"] == {
    "reward_tokens": [1.0], "reward_truncated": [0.0], "reward_masked": [0.0]
}, out
assert not {m.split(".")[0] for m in sys.modules} & HEAVY
"""
    )
    result = run_light(code)
    assert result.returncode == 0, result.stderr
