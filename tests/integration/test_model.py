"""RewardModel against independent per-text references, on real tiny transformers models."""

from __future__ import annotations

import json
import random
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from tokenizers import processors
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import tiny_models
from reward_server.config import ServerSettings
from reward_server.engines.transformers import RewardModel
from reward_server.errors import ChatTemplateError, ModelLoadError, TextTooLongError
from reward_server.http.app import create_app
from reward_server.scoring.registry import COMPUTE_THREAD_PREFIX
from reward_server.text.rendering import Encoded

ATOL = 1e-5


# ---------------------------------------------------------------------- helpers


def reference_model(path: Path) -> torch.nn.Module:
    """An independently loaded copy of the checkpoint, float32, eval mode."""
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def reference_score(model: torch.nn.Module, ids: list[int], label: int = 0) -> float:
    """One unpadded text, batch of one; decoders: the head applied to the last hidden state."""
    x = torch.tensor([ids])
    if model.config.model_type == "bert":
        return float(model(input_ids=x).logits[0, label])
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=x).last_hidden_state  # (1, T, H)
    return float(model.score(hidden[0, -1])[label])


def texts_of_many_lengths(rm: RewardModel, n: int = 50, seed: int = 0) -> list[str]:
    """``n`` texts whose encodings span 1 to 200 tokens, in shuffled order."""
    rng = random.Random(seed)
    words = " ".join(tiny_models.make_corpus(60, seed=seed, min_words=30, max_words=40)).split()
    targets = [1, 2, 200, *(rng.randint(1, 200) for _ in range(n - 3))]
    rng.shuffle(targets)
    texts = []
    for start, target in enumerate(targets):
        # Binary search: the most words whose encoding fits the target (at least one word).
        lo, hi = 1, 200
        while lo < hi:
            mid = (lo + hi + 1) // 2
            (enc,) = rm.encode([" ".join(words[start : start + mid])], truncate=True)
            lo, hi = (mid, hi) if enc.num_tokens <= target else (lo, mid - 1)
        texts.append(" ".join(words[start : start + lo]))
    return texts


@pytest.fixture(scope="module")
def bert(bert_rm: Path) -> RewardModel:
    return RewardModel.load(str(bert_rm))


@pytest.fixture(scope="module")
def gpt2(gpt2_rm: Path) -> RewardModel:
    return RewardModel.load(str(gpt2_rm))


@pytest.fixture(scope="module")
def llama(llama_rm: Path) -> RewardModel:
    return RewardModel.load(str(llama_rm))


@pytest.fixture(params=["bert", "gpt2", "llama"])
def any_rm(request: pytest.FixtureRequest) -> tuple[RewardModel, Path]:
    rm = request.getfixturevalue(request.param)
    return rm, request.getfixturevalue(f"{request.param}_rm")


# ---------------------------------------------------------------------- loading


def test_load_reports_info(gpt2: RewardModel, gpt2_rm: Path) -> None:
    info = gpt2.info()
    assert info == {
        "model": str(gpt2_rm),
        "adapter": None,
        "architecture": "GPT2ForSequenceClassification",
        "num_labels": 1,
        "label_index": 0,
        "max_length": 512,
        "truncation_side": "left",
        "dtype": "float32",
        "device": "cpu",
        "chat_template": False,
    }
    assert gpt2.is_decoder
    assert not gpt2.model.training


def test_encoder_is_not_decoder(bert: RewardModel) -> None:
    assert not bert.is_decoder
    assert bert.architecture == "BertForSequenceClassification"


def test_tokenizer_without_pad_gets_eos(llama: RewardModel) -> None:
    tok = llama.tokenizer
    assert tok.pad_token == tok.eos_token == "</s>"
    assert llama.model.config.pad_token_id == tok.eos_token_id
    assert llama.has_chat_template


# ---------------------------------------------------------------------- the right token


def test_scores_equal_per_text_reference(any_rm: tuple[RewardModel, Path]) -> None:
    rm, path = any_rm
    ref = reference_model(path)
    texts = tiny_models.make_corpus(12, seed=3)
    encoded = rm.encode(texts, truncate=True)
    scores = rm.score_batch([e.input_ids for e in encoded])
    expected = [reference_score(ref, e.input_ids) for e in encoded]
    assert scores == pytest.approx(expected, abs=ATOL)
    assert len(set(round(s, 4) for s in scores)) > 6  # the head separates texts


def test_text_ending_in_eos_with_pad_eq_eos(gpt2: RewardModel, gpt2_rm: Path) -> None:
    tok = gpt2.tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    texts = [
        "the movie was great" + tok.eos_token,
        "a boring film, never again" + tok.eos_token + tok.eos_token,
        "the quick brown fox jumps over the lazy dog and the cat saw it",
    ]
    encoded = gpt2.encode(texts, truncate=True)
    assert encoded[0].input_ids[-1] == tok.eos_token_id
    rows = [e.input_ids for e in encoded]
    ref = reference_model(gpt2_rm)
    expected = [reference_score(ref, ids) for ids in rows]
    assert gpt2.score_batch(rows) == pytest.approx(expected, abs=ATOL)

    # transformers' own pooling (rightmost token != pad id) reads the wrong position here.
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.inference_mode():
        theirs = ref(input_ids=ids, attention_mask=mask).logits[:, 0].tolist()
    assert abs(theirs[0] - expected[0]) > 1e-3
    assert abs(theirs[1] - expected[1]) > 1e-3
    assert theirs[2] == pytest.approx(expected[2], abs=ATOL)


def test_batch_invariance(any_rm: tuple[RewardModel, Path]) -> None:
    rm, _ = any_rm
    encoded = rm.encode(texts_of_many_lengths(rm), truncate=True)
    lengths = [e.num_tokens for e in encoded]
    assert min(lengths) <= 3 and 190 <= max(lengths) <= 200
    rows = [e.input_ids for e in encoded]
    alone = [rm.score_batch([r])[0] for r in rows]
    together = rm.score_batch(rows)
    assert together == pytest.approx(alone, abs=ATOL)
    rng = random.Random(1)
    for _ in range(3):
        order = list(range(len(rows)))
        rng.shuffle(order)
        got: dict[int, float] = {}
        start = 0
        while start < len(order):
            size = rng.randint(1, 12)
            chunk = order[start : start + size]
            for i, s in zip(chunk, rm.score_batch([rows[i] for i in chunk]), strict=True):
                got[i] = s
            start += size
        assert [got[i] for i in range(len(rows))] == pytest.approx(alone, abs=ATOL)


def test_label_index(tmp_path: Path) -> None:
    path = tiny_models.save_gpt2_reward_model(tmp_path / "two", num_labels=2)
    rm0 = RewardModel.load(str(path))
    rm1 = RewardModel.load(str(path), label_index=1)
    assert rm1.info()["num_labels"] == 2 and rm1.label_index == 1
    ref = reference_model(path)
    rows = [e.input_ids for e in rm1.encode(tiny_models.make_corpus(6, seed=5), truncate=True)]
    assert rm0.score_batch(rows) == pytest.approx(
        [reference_score(ref, r, 0) for r in rows], abs=ATOL
    )
    assert rm1.score_batch(rows) == pytest.approx(
        [reference_score(ref, r, 1) for r in rows], abs=ATOL
    )
    # Every label's logit at once (what a multi-label endpoint reads), the same numbers.
    both = rm1.logits_batch(rows)
    assert [row[0] for row in both] == rm0.score_batch(rows)
    assert [row[1] for row in both] == rm1.score_batch(rows)
    with pytest.raises(ModelLoadError, match="label_index 2 out of range"):
        RewardModel.load(str(path), label_index=2)


def test_empty_text_is_scored(gpt2: RewardModel, bert: RewardModel) -> None:
    (g,) = gpt2.encode([""], truncate=False)
    assert g == Encoded(input_ids=[gpt2.tokenizer.bos_token_id], truncated=False, num_tokens=1)
    (b,) = bert.encode([""], truncate=False)
    assert b.input_ids == [bert.tokenizer.cls_token_id, bert.tokenizer.sep_token_id]
    assert len(gpt2.score_batch([g.input_ids])) == 1
    with pytest.raises(ValueError, match="empty row"):
        gpt2.score_batch([[]])


# ---------------------------------------------------------------------- truncation


LONG = " ".join(tiny_models.make_corpus(10, seed=9, min_words=20, max_words=20))


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_decoder(gpt2_rm: Path, side: str) -> None:
    rm = RewardModel.load(str(gpt2_rm), max_length=16, truncation_side=side)
    full = rm.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    assert len(full) > 16
    long_enc, short_enc = rm.encode([LONG, "hello world"], truncate=True)
    assert long_enc.truncated and long_enc.num_tokens == 16
    assert long_enc.input_ids == (full[-16:] if side == "left" else full[:16])
    assert not short_enc.truncated
    assert short_enc.input_ids == rm.tokenizer("hello world")["input_ids"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_keeps_bert_specials(bert_rm: Path, side: str) -> None:
    rm = RewardModel.load(str(bert_rm), max_length=12, truncation_side=side)
    tok = rm.tokenizer
    content = tok(LONG, add_special_tokens=False)["input_ids"]
    (enc,) = rm.encode([LONG], truncate=True)
    kept = content[-10:] if side == "left" else content[:10]
    assert enc.input_ids == [tok.cls_token_id, *kept, tok.sep_token_id]
    assert enc.truncated and enc.num_tokens == 12
    (exact,) = rm.encode(["hello world"], truncate=True)
    assert exact.input_ids == tok("hello world")["input_ids"] and not exact.truncated


def test_no_truncate_raises_with_index(bert_rm: Path) -> None:
    rm = RewardModel.load(str(bert_rm), max_length=12)
    total = len(rm.tokenizer(LONG)["input_ids"])
    with pytest.raises(TextTooLongError) as err:
        rm.encode(["short one", LONG], truncate=False)
    assert (err.value.index, err.value.num_tokens, err.value.max_length) == (1, total, 12)
    assert "text 1" in str(err.value)
    assert not rm.encode(["short one"], truncate=False)[0].truncated


def test_default_max_length_is_model_limit(tmp_path: Path) -> None:
    path = tiny_models.save_gpt2_reward_model(tmp_path / "g")
    tok = AutoTokenizer.from_pretrained(path)
    tok.model_max_length = int(1e30)  # transformers' "unknown" sentinel
    tok.save_pretrained(path)
    assert RewardModel.load(str(path)).max_length == 512  # from n_positions


# ---------------------------------------------------------------------- special tokens


@pytest.fixture(scope="module")
def llama_with_bos(llama_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama whose tokenizer prepends BOS, and a template that starts with BOS."""
    path = tmp_path_factory.mktemp("llama_bos") / "m"
    shutil.copytree(llama_rm, path)
    tok = AutoTokenizer.from_pretrained(path)
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
    )
    tok.chat_template = "{{ bos_token }}" + tiny_models.CHAT_TEMPLATE
    tok.save_pretrained(path)
    return path


def test_bos_rule_no_double_bos(llama_with_bos: Path) -> None:
    rm = RewardModel.load(str(llama_with_bos))
    bos = rm.tokenizer.bos_token_id
    (rendered,) = rm.render_pairs(["hi there"], ["hello"])
    assert rendered.startswith("<s><|user|>")
    plain, templated = rm.encode(["hi there", rendered], truncate=True)
    assert plain.input_ids[0] == bos and plain.input_ids[1] != bos
    assert templated.input_ids[0] == bos and templated.input_ids[1] != bos
    # A text that already starts with BOS is taken as is: same ids as the rendered string.
    (same,) = rm.encode([rendered], truncate=True)
    assert same == templated
    # Left truncation keeps the leading BOS in place.
    short = RewardModel.load(str(llama_with_bos), max_length=8)
    (cut,) = short.encode([rendered + LONG], truncate=True)
    assert cut.truncated and cut.num_tokens == 8 and cut.input_ids[0] == bos


# ---------------------------------------------------------------------- chat templates


def test_pair_rendering_equals_apply_chat_template(llama: RewardModel, llama_rm: Path) -> None:
    tok = AutoTokenizer.from_pretrained(llama_rm)
    by_hand = tok.apply_chat_template(
        [{"role": "user", "content": "is it good?"}, {"role": "assistant", "content": "yes"}],
        tokenize=False,
    )
    assert llama.render_pairs(["is it good?"], ["yes"]) == [by_hand]
    conv = [[{"role": "user", "content": "is it good?"}, {"role": "assistant", "content": "yes"}]]
    assert llama.render_conversations(conv) == [by_hand]
    rows = [e.input_ids for e in llama.encode([by_hand], truncate=True)]
    assert llama.score_batch(rows) == pytest.approx(
        [reference_score(reference_model(llama_rm), rows[0])], abs=ATOL
    )


def test_without_template_pairs_join_and_conversations_fail(
    gpt2: RewardModel, llama_rm: Path
) -> None:
    assert gpt2.render_pairs(["q: ", "x"], ["a", "y"]) == ["q: a", "xy"]
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        gpt2.render_conversations([[{"role": "user", "content": "hi"}]])
    rm = RewardModel.load(str(llama_rm), chat_template="none")
    assert not rm.info()["chat_template"]
    assert rm.render_pairs(["q"], ["r"]) == ["qr"]
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        rm.render_conversations([[{"role": "user", "content": "hi"}]])


def test_template_file_replaces_template(gpt2_rm: Path, tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    rm = RewardModel.load(str(gpt2_rm), chat_template=str(template))
    assert rm.info()["chat_template"] is True
    assert rm.render_pairs(["q"], ["r"]) == ["[user] q\n[assistant] r\n"]


def test_template_error_is_chat_template_error(gpt2_rm: Path, tmp_path: Path) -> None:
    template = tmp_path / "strict.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('no system role') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    rm = RewardModel.load(str(gpt2_rm), chat_template=str(template))
    with pytest.raises(ChatTemplateError, match=r"conversation 1.*no system role"):
        rm.render_conversations(
            [[{"role": "user", "content": "a"}], [{"role": "system", "content": "b"}]]
        )


# ---------------------------------------------------------------------- PEFT


@pytest.fixture(scope="module")
def lora_adapter(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A LoRA adapter (c_attn + trained score head) and its in-process peft scores."""
    from peft import LoraConfig, get_peft_model

    base = reference_model(gpt2_rm)
    config = LoraConfig(
        task_type="SEQ_CLS", target_modules=["c_attn"], r=4, lora_alpha=8, fan_in_fan_out=True
    )
    peft_model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    peft_model.eval()
    tok = AutoTokenizer.from_pretrained(gpt2_rm)
    texts = tiny_models.make_corpus(8, seed=11)
    expected = {}
    with torch.inference_mode():
        for text in texts:
            ids = tok(text)["input_ids"]
            assert ids[-1] != tok.eos_token_id  # batch of one, no EOS: peft's own pooling is right
            expected[text] = float(peft_model(input_ids=torch.tensor([ids])).logits[0, 0])
    path = tmp_path_factory.mktemp("lora") / "adapter"
    peft_model.save_pretrained(path)
    return path, expected


@pytest.mark.parametrize("merge", [False, True])
def test_peft_adapter_matches_in_process(
    gpt2: RewardModel, gpt2_rm: Path, lora_adapter: tuple[Path, dict], merge: bool
) -> None:
    path, expected = lora_adapter
    rm = RewardModel.load(str(gpt2_rm), adapter=str(path), merge_adapter=merge)
    assert rm.info()["adapter"] == str(path) and rm.is_decoder
    texts = list(expected)
    rows = [e.input_ids for e in rm.encode(texts, truncate=True)]
    scores = rm.score_batch(rows)  # one padded batch
    assert scores == pytest.approx([expected[t] for t in texts], abs=1e-4)
    base_scores = gpt2.score_batch(rows)
    assert max(abs(a - b) for a, b in zip(scores, base_scores, strict=True)) > 1e-2
    # Texts ending in EOS with pad == eos stay right through the adapter too.
    eos_rows = [[*r, rm.tokenizer.eos_token_id] for r in rows[:3]]
    alone = [rm.score_batch([r])[0] for r in eos_rows]
    assert rm.score_batch([*eos_rows, *rows])[:3] == pytest.approx(alone, abs=ATOL)


# ---------------------------------------------------------------------- load failures


def _load_error(*args: object, **kwargs: object) -> str:
    with pytest.raises(ModelLoadError) as err:
        RewardModel.load(*args, **kwargs)  # type: ignore[arg-type]
    message = str(err.value)
    assert "\n" not in message
    return message


def test_load_errors(
    tmp_path: Path, bert_rm: Path, gpt2_rm: Path, gpt2_policy: Path, lora_adapter: tuple[Path, dict]
) -> None:
    assert "not found" in _load_error(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "config" in _load_error(str(tmp_path / "empty"))
    assert "not a sequence-classification model" in _load_error(str(gpt2_policy))
    assert "someone/no-such-model" in _load_error("someone/no-such-model")
    assert "adapter folder not found" in _load_error(str(gpt2_rm), adapter=str(tmp_path / "nope"))
    assert "adapter" in _load_error(str(gpt2_rm), adapter=str(tmp_path / "empty"))
    bad = tmp_path / "bad_adapter"
    shutil.copytree(lora_adapter[0], bad)
    cfg = (bad / "adapter_config.json").read_text().replace('"c_attn"', '"no_such_layer"')
    (bad / "adapter_config.json").write_text(cfg)
    assert "adapter" in _load_error(str(gpt2_rm), adapter=str(bad))
    assert "label_index" in _load_error(str(gpt2_rm), label_index=3)
    assert "chat template file not found" in _load_error(str(gpt2_rm), chat_template="x.jinja")
    assert "dtype" in _load_error(str(gpt2_rm), dtype="float8")
    assert "truncation_side" in _load_error(str(gpt2_rm), truncation_side="middle")
    assert "device" in _load_error(str(gpt2_rm), device="tpu:7")
    assert "max_length must be positive" in _load_error(str(gpt2_rm), max_length=0)
    assert "leaves no room" in _load_error(str(bert_rm), max_length=2)
    if not torch.cuda.is_available():
        assert "CUDA is not available" in _load_error(str(gpt2_rm), device="cuda")


def test_bfloat16_on_cpu(gpt2_rm: Path, gpt2: RewardModel) -> None:
    rm = RewardModel.load(str(gpt2_rm), dtype="bfloat16")
    assert rm.dtype == "bfloat16"
    rows = [e.input_ids for e in rm.encode(tiny_models.make_corpus(4, seed=2), truncate=True)]
    assert rm.score_batch(rows) == pytest.approx(gpt2.score_batch(rows), abs=0.1)


def test_base_lm_plus_adapter_with_head(
    gpt2_rm: Path, lora_adapter: tuple[Path, dict], tmp_path: Path
) -> None:
    """A causal-LM checkpoint + a SEQ_CLS adapter carrying the head (TRL's LoRA layout)."""
    from transformers import AutoModelForCausalLM

    lm_path = tmp_path / "base_lm"
    AutoModelForCausalLM.from_pretrained(gpt2_rm).save_pretrained(lm_path)
    AutoTokenizer.from_pretrained(gpt2_rm).save_pretrained(lm_path)
    assert "not a sequence-classification model" in _load_error(str(lm_path))

    path, expected = lora_adapter
    rm = RewardModel.load(str(lm_path), adapter=str(path))
    texts = list(expected)
    rows = [e.input_ids for e in rm.encode(texts, truncate=True)]
    assert rm.score_batch(rows) == pytest.approx([expected[t] for t in texts], abs=1e-4)

    headless = tmp_path / "headless"
    shutil.copytree(path, headless)
    cfg = json.loads((headless / "adapter_config.json").read_text())
    cfg["modules_to_save"] = None
    (headless / "adapter_config.json").write_text(json.dumps(cfg))
    assert "does not provide one" in _load_error(str(lm_path), adapter=str(headless))


def test_loading_and_scoring_run_on_the_one_compute_thread(
    bert_rm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch work stays on one thread: a second OpenMP team would slow every pass on CPU."""
    seen: list[threading.Thread] = []
    real_load = RewardModel.from_options.__func__  # type: ignore[attr-defined]

    def spy_load(cls: type[RewardModel], *args: object, **kwargs: object) -> RewardModel:
        seen.append(threading.current_thread())
        return real_load(cls, *args, **kwargs)

    monkeypatch.setattr(RewardModel, "from_options", classmethod(spy_load))
    RewardModel.load(str(bert_rm))  # the library loads where it is called
    assert seen == [threading.current_thread()]

    passes: list[threading.Thread] = []
    app = create_app(ServerSettings(model=str(bert_rm)))  # the server's way: it loads
    with TestClient(app) as client:
        rm = app.state.registry.model
        rm.model.register_forward_pre_hook(lambda *_: passes.append(threading.current_thread()))
        r = client.post("/score", json={"texts": ["a short text", "and a longer one here"]})
        assert r.status_code == 200, r.text
    assert seen[1].name.startswith(COMPUTE_THREAD_PREFIX)
    assert passes and all(t is seen[1] for t in passes)


def test_concurrent_calls_from_threads_score_alike(gpt2: RewardModel) -> None:
    """A library user may score from several threads at once (no lock, no shared state)."""
    texts = tiny_models.make_corpus(12, seed=9)
    rows = [e.input_ids for e in gpt2.encode(texts, truncate=True)]
    alone = gpt2.score_batch(rows)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: gpt2.score_batch(rows), range(16)))
    for got in results:
        assert got == pytest.approx(alone, abs=ATOL)
