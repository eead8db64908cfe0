"""The vLLM engine's settings, from flags to vLLM's engine arguments (no vLLM needed)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from reward_server.cli import parse_settings
from reward_server.config import LoadOptions
from reward_server.engines import vllm as vllm_engine
from reward_server.engines.vllm import bind_cpu_workers, engine_args, reserve_scheduler_cpus
from reward_server.errors import ModelLoadError


def test_flags_reach_the_engine_arguments() -> None:
    settings = parse_settings(
        [
            "--model", "m", "--engine", "vllm", "--tensor-parallel-size", "4",
            "--max-num-batched-tokens", "8192", "--no-enable-prefix-caching",
            "--engine-arg", "max_num_seqs=128", "--engine-arg", "enforce-eager=true",
            "--engine-arg", "kv_cache_dtype=fp8",
        ]
    )  # fmt: skip
    assert settings.engine == "vllm"
    options = LoadOptions.from_settings(settings)
    assert options.engine_arg == ("max_num_seqs=128", "enforce-eager=true", "kv_cache_dtype=fp8")
    args = engine_args(options, "/m", 512, "cuda")
    assert args["runner"] == "pooling" and args["model"] == "/m" and args["max_model_len"] == 512
    assert args["tensor_parallel_size"] == 4 and args["max_num_batched_tokens"] == 8192
    assert args["enable_prefix_caching"] is False and args["gpu_memory_utilization"] == 0.9
    assert args["max_num_seqs"] == 128 and args["enforce_eager"] is True  # JSON values
    assert args["kv_cache_dtype"] == "fp8" and args["dtype"] == "auto"  # text as it is


def test_defaults_on_cpu() -> None:
    options = LoadOptions.from_settings(parse_settings(["--model", "m", "--engine", "vllm"]))
    args = engine_args(options, "/m", 64, "cpu")
    assert args["enable_prefix_caching"] is True
    assert args["gpu_memory_utilization"] == 0.15 and args["dtype"] == "float32"
    assert "max_num_batched_tokens" not in args and args["skip_tokenizer_init"] is True


def test_an_engine_arg_without_a_value_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="not KEY=VALUE"):
        engine_args(LoadOptions(model="m", engine_arg=("enforce_eager",)), "/m", 64, "cpu")


def test_cpu_workers_share_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4})
    monkeypatch.setattr(vllm_engine, "numa_nodes", lambda: 1)
    assert bind_cpu_workers(1) is None
    assert bind_cpu_workers(2) == "0,1|2,3"
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    assert bind_cpu_workers(2) is None  # set: the user's (or the first) choice stays
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    with pytest.raises(ModelLoadError, match="6 vLLM CPU workers need 6 CPUs"):
        bind_cpu_workers(6)
    monkeypatch.setattr(vllm_engine, "numa_nodes", lambda: 2)
    assert bind_cpu_workers(2) is None  # a node each: vLLM binds by itself


@pytest.fixture
def reserve_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)


@pytest.mark.usefixtures("reserve_unset")
def test_a_small_machine_reserves_no_cpu_for_vllms_scheduler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    with caplog.at_level(logging.INFO, logger="reward_server"):
        assert reserve_scheduler_cpus(1) == "0"
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert [r.getMessage() for r in caplog.records] == [
        "vLLM reserves no CPU for its scheduler: 2 CPU(s) for 1 worker(s) "
        "(VLLM_CPU_NUM_OF_RESERVED_CPU=0; set it to keep vLLM's default of one per worker)"
    ]


@pytest.mark.usefixtures("reserve_unset")
@pytest.mark.parametrize(("cpus", "ranks", "expected"), [
    (3, 1, "0"), (4, 1, None), (64, 1, None), (4, 2, "0"), (7, 2, "0"), (8, 2, None),
])  # fmt: skip
def test_vllms_default_stays_where_it_costs_a_quarter_or_less(
    monkeypatch: pytest.MonkeyPatch, cpus: int, ranks: int, expected: str | None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    assert reserve_scheduler_cpus(ranks) == expected
    assert os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == expected


def test_the_users_reservation_is_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    with caplog.at_level(logging.INFO, logger="reward_server"):
        assert reserve_scheduler_cpus(1) is None
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert not caplog.records


@pytest.mark.usefixtures("reserve_unset")
def test_the_reservation_is_set_before_vllm_starts(
    monkeypatch: pytest.MonkeyPatch, llama_rm: Path
) -> None:
    """The engine's own start-up path on CPU, up to the call that would start vLLM."""
    seen: dict[str, str | None] = {}

    def start_engine(args: object) -> object:
        seen["reserved"] = os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU")
        raise ModelLoadError("stopped before vLLM starts")

    monkeypatch.setattr(vllm_engine, "_platform_device", lambda: "cpu")
    monkeypatch.setattr(vllm_engine, "_start_engine", start_engine)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    with pytest.raises(ModelLoadError, match="stopped before vLLM starts"):
        vllm_engine.VllmRewardModel.from_options(LoadOptions(model=str(llama_rm)))
    assert seen == {"reserved": "0"}


def test_entries_with_the_same_engine_arguments_share_one_engine() -> None:
    """The registry of engines: one start per set of arguments, one user more per entry,
    the engine's shutdown left to its last user."""
    engines = vllm_engine._Engines()
    started: list[str] = []

    def starter(name: str) -> object:
        def start() -> object:
            started.append(name)
            return name

        return start

    options = LoadOptions(model="judge")
    args = engine_args(options, "/models/judge", 512, "cpu", "generate")
    same = engines.key(dict(reversed(list(args.items()))))  # the order of the keys is no matter
    other = engines.key(engine_args(options, "/models/judge", 513, "cpu", "generate"))
    assert same == engines.key(args) and other != same

    assert engines.get_or_start(same, starter("first")) == "first"
    assert engines.get_or_start(same, starter("second")) == "first"
    assert engines.get_or_start(other, starter("third")) == "third"
    assert started == ["first", "third"]
    assert engines.users(same) == 2 and engines.users(other) == 1

    assert engines.release(same) is False  # another entry still uses it
    assert engines.release(same) is True  # the last: its user shuts it down
    assert engines.users(same) == 0
    assert engines.get_or_start(same, starter("again")) == "again"  # a new start after that
