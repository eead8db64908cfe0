"""A LoRA adapter on the tiny GPT-2 reward model, served by the real ``reward-server``.

One real process (unmerged, the default); merged and unmerged adapters are scored in process
by tests/integration/test_model.py::test_peft_adapter_matches_in_process, and ``--merge-adapter`` reaching
the settings by tests/unit/test_server_cli.py::test_flags_override_environment."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from server_proc import running_server
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tiny_models import make_corpus

TEXTS = make_corpus(12, seed=11, min_words=1, max_words=50)


@pytest.fixture(scope="module")
def adapter(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter (attention + MLP, trainable score head) with perturbed weights."""
    base = AutoModelForSequenceClassification.from_pretrained(gpt2_rm)
    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["c_attn", "c_fc"],
        fan_in_fan_out=True,  # GPT-2 uses Conv1D layers
    )
    model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # LoRA B starts at zero (a no-op adapter); the head copy starts equal to the base.
            if "lora_" in name or "modules_to_save" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    path = tmp_path_factory.mktemp("lora")
    model.save_pretrained(path)
    return path


def peft_scores(base_path: Path, adapter_path: Path | None, texts: list[str]) -> list[float]:
    """In-process scores, one unpadded text at a time, with peft's own forward pass."""
    tok = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForSequenceClassification.from_pretrained(base_path)
    if adapter_path is not None:
        model = PeftModel.from_pretrained(model, adapter_path)
    model.eval()
    out = []
    with torch.inference_mode():
        for text in texts:  # no EOS in these texts, so the model's pooling is the last token
            ids = torch.tensor([tok(text)["input_ids"]])
            out.append(float(model(input_ids=ids).logits[0, 0]))
    return out


@pytest.fixture(scope="module")
def reference(gpt2_rm: Path, adapter: Path) -> list[float]:
    scores = peft_scores(gpt2_rm, adapter, TEXTS)
    base = peft_scores(gpt2_rm, None, TEXTS)
    # The adapter must matter, or the comparison below would prove nothing.
    assert max(abs(a - b) for a, b in zip(scores, base, strict=True)) > 1e-2
    return scores


def test_adapter_scores_match_peft_in_process(
    gpt2_rm: Path, adapter: Path, reference: list[float]
) -> None:
    with running_server(gpt2_rm, "--adapter", str(adapter)) as server:
        r = httpx.post(f"{server.url}/score", json={"texts": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["scores"] == pytest.approx(reference, abs=1e-4)
        info = httpx.get(f"{server.url}/info").json()
        assert info["adapter"] == str(adapter)
