"""Several reward models behind one endpoint (``--models``): a tiny BERT WordPiece model and a
tiny GPT-2 BPE model in one server, each component equal to a single-model server's score,
the aggregates, normalize, model selection, a three-label head with named objectives, the
protocols' single label, and a failing model's batch failing only its own request."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers.fakes import POISON, FakeModel, fake_score, fake_score_ids
from helpers.models_files import next_models_file
from helpers.posting import assert_error
from server_proc import running_server

import tiny_models
from reward_server import cli
from reward_server.config import ServerSettings
from reward_server.engines.transformers import RewardModel
from reward_server.errors import ModelLoadError
from reward_server.http.app import create_app

TEXTS = ["The answer is 4.", "hello there, general", "a b c d e f g", "x"]
QUERIES = ["What is 2+2?", "Say hi."]
RESPONSES = ["4", "Hello! How are you today?"]
ATOL = 1e-5
LABELS = ["helpfulness", "safety", "verbosity"]


def settings(**overrides: Any) -> ServerSettings:
    return ServerSettings(**{"max_wait_ms": 1.0, **overrides})


@pytest.fixture(scope="module")
def armo_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT reward model with a three-label head named through id2label."""
    path = tiny_models.save_bert_reward_model(
        tmp_path_factory.mktemp("armo_rm"), seed=5, num_labels=3
    )
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config["id2label"] = {str(i): name for i, name in enumerate(LABELS)}
    config["label2id"] = {name: i for i, name in enumerate(LABELS)}
    config_path.write_text(json.dumps(config))
    return path


def single_answers(model: Path, **overrides: Any) -> dict[str, dict[str, Any]]:
    """A one-model server's /score answers for TEXTS and for the pairs."""
    with TestClient(create_app(settings(model=str(model), **overrides))) as client:
        texts = client.post("/score", json={"texts": TEXTS})
        pairs = client.post("/score", json={"queries": QUERIES, "responses": RESPONSES})
    assert texts.status_code == pairs.status_code == 200, texts.text + pairs.text
    return {"texts": texts.json(), "pairs": pairs.json()}


@pytest.fixture(scope="module")
def single(bert_rm: Path, gpt2_rm: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """What single-model servers answer, by model name then input form."""
    return {"bert": single_answers(bert_rm), "gpt2": single_answers(gpt2_rm)}


@pytest.fixture(scope="module")
def loaded(bert_rm: Path, gpt2_rm: Path) -> dict[str, RewardModel]:
    """The two models loaded once, handed to several apps (the scorer seam)."""
    return {"bert": RewardModel.load(str(bert_rm)), "gpt2": RewardModel.load(str(gpt2_rm))}


@pytest.fixture
def two_models(tmp_path: Path, bert_rm: Path, gpt2_rm: Path) -> Iterator[TestClient]:
    """bert (weight 0.5) + gpt2 (weight 2, normalized), loaded from their folders by the app."""
    path = next_models_file(
        tmp_path,
        [
            {"name": "bert", "model": str(bert_rm), "weight": 0.5},
            {
                "name": "gpt2",
                "model": str(gpt2_rm),
                "weight": 2.0,
                "normalize": {"mean": 0.25, "std": 4.0},
            },
        ],
    )
    with TestClient(create_app(settings(models=str(path)))) as client:
        yield client


def payload(form: str) -> dict[str, Any]:
    return {"texts": TEXTS} if form == "texts" else {"queries": QUERIES, "responses": RESPONSES}


def weighted(
    scores: Sequence[float], weight: float, mean: float = 0.0, std: float = 1.0
) -> list[float]:
    return [weight * (s - mean) / std for s in scores]


@pytest.mark.parametrize("form", ["texts", "pairs"])
def test_each_component_equals_a_single_model_server(
    two_models: TestClient, single: dict[str, dict[str, dict[str, Any]]], form: str
) -> None:
    r = two_models.post("/score", json=payload(form))
    assert r.status_code == 200, r.text
    body = r.json()
    bert, gpt2 = single["bert"][form], single["gpt2"][form]
    assert body["model"] == "bert+gpt2"
    assert set(body) == {"scores", "tokens", "truncated", "model", "components"}
    assert body["components"]["bert"] == pytest.approx(bert["scores"], abs=ATOL)
    assert body["components"]["gpt2"] == pytest.approx(gpt2["scores"], abs=ATOL)
    # weighted_sum by default; gpt2 is normalized before its weight
    expected = [
        a + b
        for a, b in zip(
            weighted(bert["scores"], 0.5), weighted(gpt2["scores"], 2.0, 0.25, 4.0), strict=True
        )
    ]
    assert body["scores"] == pytest.approx(expected, abs=ATOL)
    assert body["tokens"] == [
        max(a, b) for a, b in zip(bert["tokens"], gpt2["tokens"], strict=True)
    ]
    assert body["truncated"] == [False] * len(body["scores"])


def test_info_and_metrics_describe_every_model(two_models: TestClient, bert_rm: Path) -> None:
    info = two_models.get("/info").json()
    assert info["model"] == str(bert_rm)  # the top-level fields describe the first model
    assert info["aggregate"] == "weighted_sum"
    models = {m["name"]: m for m in info["models"]}
    assert list(models) == ["bert", "gpt2"]
    assert models["bert"]["kind"] == "sequence" and models["bert"]["weight"] == 0.5
    assert models["gpt2"]["normalize"] == {"mean": 0.25, "std": 4.0}
    assert models["gpt2"]["architecture"] == "GPT2ForSequenceClassification"
    assert models["bert"]["architecture"] == "BertForSequenceClassification"
    assert two_models.post("/score", json={"texts": TEXTS}).status_code == 200
    metrics = two_models.get("/metrics").text
    for name in ("bert", "gpt2"):
        assert f'reward_server_model_items_total{{model="{name}"}} {float(len(TEXTS))}' in metrics
        assert f'reward_server_model_batches_total{{model="{name}",outcome="ok"}}' in metrics
    assert f'reward_server_items_total{{endpoint="/score"}} {float(len(TEXTS))}' in metrics


@pytest.mark.parametrize("aggregate", ["weighted_sum", "mean", "min"])
def test_aggregates_normalize_before_the_weights(
    tmp_path: Path,
    loaded: dict[str, RewardModel],
    single: dict[str, dict[str, dict[str, Any]]],
    aggregate: str,
) -> None:
    path = next_models_file(
        tmp_path,
        [
            {
                "name": "bert",
                "model": "unused-bert",
                "weight": 3.0,
                "normalize": {"mean": -0.5, "std": 0.5},
            },
            {"name": "gpt2", "model": "unused-gpt2", "weight": -1.0},
        ],
        aggregate=aggregate,
    )
    with TestClient(create_app(settings(models=str(path)), models=loaded)) as client:
        body = client.post("/score", json={"texts": TEXTS}).json()
    v_bert = weighted(single["bert"]["texts"]["scores"], 3.0, -0.5, 0.5)
    v_gpt2 = weighted(single["gpt2"]["texts"]["scores"], -1.0)
    pairs = list(zip(v_bert, v_gpt2, strict=True))
    expected = {
        "weighted_sum": [a + b for a, b in pairs],
        "mean": [(a + b) / 2 for a, b in pairs],
        "min": [min(a, b) for a, b in pairs],
    }[aggregate]
    assert body["scores"] == pytest.approx(expected, abs=ATOL)
    # the components stay each model's own, raw score
    assert body["components"]["bert"] == pytest.approx(single["bert"]["texts"]["scores"], abs=ATOL)


def test_a_request_may_name_one_model(two_models: TestClient, single: dict[str, Any]) -> None:
    r = two_models.post("/score", json={"texts": TEXTS, "model": "gpt2"})
    assert r.status_code == 200, r.text
    body = r.json()
    # that model alone, raw as a single-model server answers (no weight, no normalize)
    assert body["scores"] == pytest.approx(single["gpt2"]["texts"]["scores"], abs=ATOL)
    assert body["model"] == "gpt2" and body["tokens"] == single["gpt2"]["texts"]["tokens"]
    assert "components" not in body
    asked = two_models.post("/score", json={"texts": TEXTS, "model": "bert", "components": True})
    assert asked.json()["components"] == {"bert": pytest.approx(asked.json()["scores"])}
    error = assert_error(
        two_models.post("/score", json={"texts": TEXTS, "model": "roberta"}), 422, "unknown_model"
    )
    assert "'roberta'" in error["error"] and "'bert', 'gpt2'" in error["error"]


def test_a_plain_model_server_gives_the_breakdown_when_asked(
    bert_rm: Path, single: dict[str, Any]
) -> None:
    with TestClient(create_app(settings(model=str(bert_rm)))) as client:
        body = client.post("/score", json={"texts": TEXTS, "components": True}).json()
        info = client.get("/info").json()
        error = assert_error(
            client.post("/score", json={"texts": TEXTS, "model": "other"}), 422, "unknown_model"
        )
    assert body["components"] == {str(bert_rm): pytest.approx(single["bert"]["texts"]["scores"])}
    assert body["scores"] == pytest.approx(single["bert"]["texts"]["scores"], abs=ATOL)
    assert [m["name"] for m in info["models"]] == [str(bert_rm)]
    assert info["models"][0]["weight"] == 1.0 and info["aggregate"] == "weighted_sum"
    assert str(bert_rm) in error["error"]


def test_three_label_head_objectives_by_name(tmp_path: Path, armo_rm: Path, bert_rm: Path) -> None:
    # A one-model server with a three-label head returns every label's raw logit by name.
    plain = single_answers(armo_rm)["texts"]
    logits = plain["objectives"]
    assert list(logits) == LABELS
    assert plain["scores"] == pytest.approx(logits["helpfulness"])  # label_index 0
    # objectives: the weighted sum of the labels named; several models: "model/label" keys
    path = next_models_file(
        tmp_path,
        [
            {
                "name": "armo",
                "model": str(armo_rm),
                "objectives": {"helpfulness": 0.7, "safety": 0.3},
            },
            {"name": "bert", "model": str(bert_rm), "weight": 0.0},
        ],
    )
    with TestClient(create_app(settings(models=str(path)))) as client:
        body = client.post("/score", json={"texts": TEXTS}).json()
        info = client.get("/info").json()
    own = [0.7 * h + 0.3 * s for h, s in zip(logits["helpfulness"], logits["safety"], strict=True)]
    assert body["components"]["armo"] == pytest.approx(own, abs=ATOL)
    assert body["scores"] == pytest.approx(own, abs=ATOL)  # bert weighs 0
    assert set(body["objectives"]) == {f"armo/{label}" for label in LABELS}
    for label in LABELS:
        assert body["objectives"][f"armo/{label}"] == pytest.approx(logits[label], abs=ATOL)
    assert info["models"][0]["labels"] == LABELS
    assert info["models"][0]["objectives"] == {"helpfulness": 0.7, "safety": 0.3}
    # label_index still reads one label, from the models file and from the flag
    path = next_models_file(tmp_path, [{"name": "armo", "model": str(armo_rm), "label_index": 2}])
    with TestClient(create_app(settings(models=str(path)))) as client:
        body = client.post("/score", json={"texts": TEXTS}).json()
    assert body["scores"] == pytest.approx(logits["verbosity"], abs=ATOL)
    assert list(body["objectives"]) == LABELS and "components" not in body
    flag = single_answers(armo_rm, label_index=2)["texts"]
    assert flag["scores"] == pytest.approx(logits["verbosity"], abs=ATOL)


def test_objectives_naming_no_label_fail_the_load(tmp_path: Path, armo_rm: Path) -> None:
    path = next_models_file(
        tmp_path, [{"name": "armo", "model": str(armo_rm), "objectives": {"honesty": 1.0}}]
    )
    app = create_app(settings(models=str(path)))
    with pytest.raises(ModelLoadError, match=r"model 'armo'.*unknown label\(s\) 'honesty'"):
        app.state.registry.load()


def test_protocols_serve_the_combined_score_as_one_label(two_models: TestClient) -> None:
    scores = two_models.post("/score", json={"texts": TEXTS}).json()["scores"]
    classify = two_models.post("/classify", json={"input": TEXTS, "use_activation": False}).json()
    assert classify["model"] == "bert+gpt2"
    assert [d["probs"] for d in classify["data"]] == [pytest.approx([s]) for s in scores]
    assert {d["label"] for d in classify["data"]} == {"aggregate"}
    tei = two_models.post("/predict", json={"inputs": [[t] for t in TEXTS], "raw_scores": True})
    assert [row[0]["score"] for row in tei.json()] == pytest.approx(scores)
    reward = two_models.post("/get_reward", json={"query": TEXTS}).json()
    assert reward["rewards"] == pytest.approx(scores)
    assert two_models.get("/v1/models").json()["data"][0]["id"] == "bert+gpt2"


# --------------------------------------------------------------------------- failures


class Unpoisoned(FakeModel):
    """The fake scorer without the poison: it scores every row."""

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        self.batches.append(len(batch))
        return [fake_score_ids(row) for row in batch]


def test_a_failing_batch_of_one_model_fails_only_its_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = next_models_file(
        tmp_path, [{"name": "a", "model": "fake-a"}, {"name": "b", "model": "fake-b"}]
    )
    a, b = Unpoisoned(), FakeModel()  # b's batch fails on the poison
    app = create_app(settings(models=str(path), max_batch_size=1), models={"a": a, "b": b})

    async def scenario() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://rm") as http:
                bodies = [
                    {"texts": ["fine", "also fine"]},
                    {"texts": ["ok", POISON]},
                    {"texts": ["z"]},
                ]
                answers = await asyncio.gather(*(http.post("/score", json=b) for b in bodies))
                after = await http.post("/score", json={"texts": ["after"]})
                return [*answers, after]

    with caplog.at_level(logging.ERROR):
        good, bad, other, after = asyncio.run(scenario())
    body = assert_error(bad, 500, "model_error")
    assert "secret" not in body["error"]
    assert "model b" in caplog.text
    for response, texts in ((good, ["fine", "also fine"]), (other, ["z"]), (after, ["after"])):
        assert response.status_code == 200, response.text
        assert response.json()["scores"] == pytest.approx([2 * fake_score(t) for t in texts])
        assert response.json()["components"] == {
            "a": pytest.approx([fake_score(t) for t in texts]),
            "b": pytest.approx([fake_score(t) for t in texts]),
        }


# --------------------------------------------------------------------------- the command line


def test_reward_server_serves_a_models_file(
    tmp_path: Path, bert_rm: Path, gpt2_rm: Path, single: dict[str, dict[str, dict[str, Any]]]
) -> None:
    path = next_models_file(
        tmp_path,
        [
            {"name": "bert", "model": str(bert_rm)},
            {"name": "gpt2", "model": str(gpt2_rm), "max_length": 4, "weight": 2.0},
        ],
        aggregate="mean",
    )
    # The expected answer comes from single-model apps in process, not from the response:
    # gpt2 alone with its own max_length 4 (its texts over 4 tokens cut on the left).
    bert = single["bert"]["texts"]["scores"]
    gpt2_cut = single_answers(gpt2_rm, max_length=4)["texts"]
    assert gpt2_cut["scores"] != pytest.approx(single["gpt2"]["texts"]["scores"], abs=ATOL)
    with running_server(None, "--models", str(path), "--max-wait-ms", "1") as server:
        r = httpx.post(f"{server.url}/score", json={"texts": TEXTS}, timeout=30)
        info = httpx.get(f"{server.url}/info", timeout=30).json()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["components"]["bert"] == pytest.approx(bert, abs=ATOL)
    assert body["components"]["gpt2"] == pytest.approx(gpt2_cut["scores"], abs=ATOL)
    assert [m["max_length"] for m in info["models"]] == [info["max_length"], 4]
    assert body["truncated"] == [n > 4 for n in single["gpt2"]["texts"]["tokens"]]
    assert any(body["truncated"]) and not all(body["truncated"])
    # aggregate "mean" of bert (weight 1) and gpt2 (weight 2)
    want = [(a + 2 * b) / 2 for a, b in zip(bert, gpt2_cut["scores"], strict=True)]
    assert body["scores"] == pytest.approx(want, abs=ATOL)


def test_a_model_that_does_not_load_is_one_line(
    tmp_path: Path,
    bert_rm: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI's main() in process; test_server_cli.py runs the console script itself."""
    path = next_models_file(
        tmp_path,
        [
            {"name": "bert", "model": str(bert_rm)},
            {"name": "gone", "model": str(tmp_path / "nope")},
        ],
    )
    monkeypatch.setattr(cli, "_configure_logging", lambda level: None)  # pytest owns logging
    assert cli.main(["--models", str(path), "--port", "1", "--log-level", "warning"]) == 1
    stderr = capsys.readouterr().err
    lines = [ln for ln in stderr.splitlines() if ln.startswith("reward-server: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"reward-server: error: could not load models of {path}: ")
    assert "model 'gone'" in lines[0] and "not found" in lines[0]
