"""OpenRLHF's own remote-reward client: its ``openrlhf/utils/agent.py`` (and the
``logging_utils.py`` it imports) from the pinned 0.11.2 wheel that ``make setup`` downloads
into ``tests/.cache`` (checked against its SHA-256), loaded under parent packages that skip
the package's ``__init__`` (which pulls DeepSpeed); and a scripted generation engine in place
of its vLLM one."""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

# One fixed wheel whatever the interpreter (the two files are pure Python), fetched by the
# Makefile's OPENRLHF_WHEEL rule.
WHEEL = "openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl"
WHEEL_SHA256 = "c969d70db03a70724c3d8a5a01186c6e0728bce624fb3dff95e39b5396acefa6"
UTILS_IN_WHEEL = "openrlhf-0.11.2.data/purelib/openrlhf/utils/"
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "openrlhf-0.11.2"

PROMPTS = ["the movie was", "i think the plot", "a story about a dog", "the actress"]
RESPONSES = [" great and funny", " was slow and dull", " that loved the cat", " was brilliant"]


def fetch_openrlhf_utils(cache: Path = CACHE) -> Path:
    """The folder holding ``openrlhf/utils/{agent,logging_utils}.py`` from the pinned wheel."""
    wheel = cache / WHEEL
    if not wheel.is_file():
        pytest.fail(f"{wheel} is missing: run `make setup`, which downloads it", pytrace=False)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == WHEEL_SHA256, f"{wheel} has SHA-256 {digest}, expected {WHEEL_SHA256}"
    root = cache / "src"
    utils = root / "openrlhf" / "utils"
    utils.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in ("agent.py", "logging_utils.py"):
            (utils / name).write_bytes(archive.read(UTILS_IN_WHEEL + name))
    return root


def load_agent_module(root: Path) -> ModuleType:
    """Import ``openrlhf.utils.agent`` from ``root`` without running the packages' __init__."""
    for name, folder in (
        ("openrlhf", root / "openrlhf"),
        ("openrlhf.utils", root / "openrlhf" / "utils"),
    ):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
    return importlib.import_module("openrlhf.utils.agent")


class ScriptedEngine:
    """Stands in for OpenRLHF's vLLM engine: answers the n-th prompt with RESPONSES[n] + EOS."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    async def generate(
        self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> SimpleNamespace:
        text = RESPONSES[self.calls % len(RESPONSES)]
        self.calls += 1
        ids = [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]
        output = SimpleNamespace(
            token_ids=ids, text=self.tokenizer.decode(ids), finish_reason="stop", logprobs=None
        )
        return SimpleNamespace(outputs=[output])
