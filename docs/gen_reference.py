"""The generated parts of the docs site: tables read from the code at build time.

``docs/hooks.py`` replaces each ``<!-- gen:NAME -->`` line of a page with ``GENERATORS[NAME]()``,
so a new setting, models-file key, route, metric or error type shows up in the site with no
hand edit. Every table is built from the pydantic models' fields (name, type, default,
docstring), the app's own OpenAPI schema, the metrics registry and the error table.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from settings_cli import flag, spellings

__all__ = [
    "GENERATORS",
    "errors_table",
    "flags_table",
    "keys_table",
    "metrics_table",
    "models_file_tables",
    "openapi_markdown",
    "openapi_schema",
    "ppo_tables",
    "server_flags",
    "type_name",
]


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: ``int | None``, ``'left' | 'right'``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:  # a tagged union's member (kind: grader's grader object)
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    """A field's default as the tables show it (a ``default_label`` in the schema extra wins)."""
    label = (field.json_schema_extra or {}).get("default_label")  # type: ignore[union-attr]
    if isinstance(label, str):
        return label
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"  # type: ignore[call-arg]
    if field.default is None or field.default is PydanticUndefined:
        return "none"
    if isinstance(field.default, bool):
        return "on" if field.default else "off"
    if isinstance(field.default, str) and field.default.strip() != field.default:
        return f"`{field.default!r}`"  # whitespace shows only quoted: "\n\n"
    return f"`{field.default}`"


def _constraints(field: FieldInfo) -> str:
    """The field's checks (``>= 1``, a pattern) from its pydantic metadata."""
    words = []
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "min length"}
    for item in field.metadata:
        for attr, symbol in symbols.items():
            value = getattr(item, attr, None)
            if value is not None:
                words.append(f"{symbol} {value}")
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            words.append(f"matches `{pattern}`")
    return ", ".join(words)


def flags_table(settings: type[BaseModel], env_prefix: str) -> str:
    """Every field of ``settings`` as a flag, its environment variable, type, default and help."""
    rows = [
        "| Flag | Environment variable | Type | Default | What it does |",
        "|---|---|---|---|---|",
    ]
    for name, field in settings.model_fields.items():
        rows.append(
            f"| `{flag(name)}` | `{env_prefix}{name.upper()}` | {type_name(field.annotation)} "
            f"| {_cell(_default(field))} | {_cell(field.description or '')} |"
        )
    return "\n".join(rows)


def keys_table(model: type[BaseModel], *, flags: bool = False) -> str:
    """Every field of ``model`` as a key: type, default, checks and its docstring."""
    head = (
        "| Key | Flag | Type | Default | Meaning |"
        if flags
        else "| Key | Type | Default | Checks | Meaning |"
    )
    rows = [head, "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        # the dashed flag as --help shows it, then the key's own spelling, which works too
        middle = ", ".join(f"`{spelling}`" for spelling in spellings(name)) if flags else None
        cells = [f"`{name}`"]
        if middle:
            cells.append(middle)
        cells += [type_name(field.annotation), _cell(_default(field))]
        if not flags:
            cells.append(_cell(_constraints(field)))
        cells.append(_cell(field.description or ""))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def server_flags() -> str:
    """The reward server's flags: every field of ``ServerSettings``."""
    from reward_server.config.settings import ENV_PREFIX, ServerSettings

    return flags_table(ServerSettings, ENV_PREFIX)


def ppo_tables() -> str:
    """Every key of ``PPOConfig`` (also a ``ppo-client train`` flag)."""
    from ppo_client.config import PPOConfig

    return keys_table(PPOConfig, flags=True)


def ppo_environment() -> str:
    """The environment variables ``ppo-client train`` reads (``RewardEnvironment``)."""
    from ppo_client.config import RewardEnvironment

    rows = ["| Variable | Sets the key | Meaning |", "|---|---|---|"]
    for name, field in RewardEnvironment.model_fields.items():
        rows.append(f"| `{field.validation_alias}` | `{name}` | {_cell(field.description or '')} |")
    return "\n".join(rows)


def _fields_table(
    model: type[BaseModel], names: Iterable[str], types: Mapping[str, str] | None = None
) -> str:
    """The fields ``names`` of ``model`` as keys: type (``types``' where given), default,
    checks and docstring."""
    rows = ["| Key | Type | Default | Checks | Meaning |", "|---|---|---|---|---|"]
    for name in names:
        field = model.model_fields[name]
        shown = (types or {}).get(name) or type_name(field.annotation)
        cells = [f"`{name}`", shown, _cell(_default(field))]
        cells += [_cell(_constraints(field)), _cell(field.description or "")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _own(model: type[BaseModel], base: type[BaseModel]) -> list[str]:
    """The fields ``model`` has beyond ``base``'s (its selector, kind/verifier/mode, left out)."""
    selectors = {"kind", "verifier", "mode"}
    return [n for n in model.model_fields if n not in base.model_fields and n not in selectors]


def models_file_tables() -> str:
    """The models file's top-level keys, then one table per kind of entry: what every entry
    has, what every entry that loads a model has, and each kind's (and verifier's, and judge
    mode's) own keys (the classes of :mod:`reward_server.config.entries`,
    :mod:`~reward_server.config.verifier_entries` and :mod:`~reward_server.config.remote_entry`)."""
    from reward_server.config import entries
    from reward_server.config.models_file import KINDS, ModelsFile, Normalize

    listed = {"models": "list of entries (below, by kind)"}
    parts = ["### Top level", _fields_table(ModelsFile, ModelsFile.model_fields, listed)]
    parts += ["### Every entry", _fields_table(entries.Entry, _own(entries.Entry, BaseModel))]
    loaded = _own(entries.LoadedEntry, entries.Entry)
    parts += ["### Every entry that loads a model (sequence, process, judge)"]
    parts += [_fields_table(entries.LoadedEntry, loaded)]
    for cls in KINDS:
        base = entries.LoadedEntry if issubclass(cls, entries.LoadedEntry) else entries.Entry
        kind = get_args(cls.model_fields["kind"].annotation)[0]
        title = (
            cls.SELECTOR if cls.SELECTOR.startswith("kind:") else f"kind: {kind}, {cls.SELECTOR}"
        )
        summary = (cls.__doc__ or "").strip().split("\n\n")[0]
        parts += [f"### `{title}`", " ".join(summary.split()), _fields_table(cls, _own(cls, base))]
    parts += ["### `normalize`", keys_table(Normalize)]
    return "\n\n".join(parts)


def errors_table() -> str:
    """The one table from exception kinds to HTTP status and error ``type``."""
    from reward_server.http.errors import ERRORS

    rows = ["| Status | `type` | Raised as | Meaning |", "|---|---|---|---|"]
    for exc, (status, kind) in sorted(ERRORS.items(), key=lambda kv: (kv[1], kv[0].__name__)):
        doc = (exc.__doc__ or "").strip().split("\n\n")[0]
        rows.append(f"| {status} | `{kind}` | `{exc.__name__}` | {_cell(doc)} |")
    return "\n".join(rows)


def metrics_table() -> str:
    """Every series a fresh app's metrics registry defines, with its type and help."""
    from reward_server.http.metrics import app_metrics

    registry = app_metrics()[0].registry
    # prometheus_client keeps each collector under several names (_total, _bucket, ...).
    collectors = {id(c): c for c in registry._names_to_collectors.values()}.values()
    series = []
    for c in collectors:
        if hasattr(c, "_name"):  # a counter, histogram or gauge kept by its user
            kind = getattr(c, "_type", "")
            name = c._name + ("_total" if kind == "counter" else "")
            series.append((name, kind, getattr(c, "_labelnames", ()), c._documentation))
        else:  # the collector of the gauges read at a scrape: its families
            for f in c.describe():
                series.append((f.name, f.type, getattr(f, "_labelnames", ()), f.documentation))
    rows = ["| Series | Type | Labels | What it counts |", "|---|---|---|---|"]
    for name, kind, labelnames, doc in sorted(series, key=lambda s: s[0].removesuffix("_total")):
        labels = ", ".join(f"`{label}`" for label in labelnames)
        rows.append(f"| `{name}` | {kind} | {labels} | {_cell(doc)} |")
    return "\n".join(rows)


def openapi_schema() -> dict[str, Any]:
    """The app's own OpenAPI document (a keyed server: the routes that need the key say so).

    No model is loaded: the schema comes from the routes, and the lifespan never runs.
    """
    from reward_server.config import ServerSettings
    from reward_server.http.app import create_app

    settings = ServerSettings(model="reward-model", api_key="docs-build")
    return create_app(settings).openapi()


def _schema_type(schema: Mapping[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema or "oneOf" in schema:
        return " \\| ".join(_schema_type(s) for s in schema.get("anyOf", schema.get("oneOf", [])))
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return "object" if extra is True else f"object of {_schema_type(extra)}"
    return str(kind)


def _operations(schema: Mapping[str, Any]) -> Iterable[str]:
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            yield f"### `{method.upper()} {path}`"
            yield ""
            summary = op.get("summary", "")
            description = op.get("description", "")
            yield _cell(f"{summary}. {description}" if description else summary)
            yield ""
            if op.get("security"):
                yield "Needs `Authorization: Bearer <key>` when the server has an API key."
                yield ""
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                yield f"Request body (`{media}`): {_schema_type(content.get('schema', {}))}"
                yield ""
            yield "| Status | Meaning | Body |"
            yield "|---|---|---|"
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                shapes = ", ".join(_schema_type(c.get("schema", {})) for c in content.values())
                yield f"| {status} | {_cell(response.get('description', ''))} | {shapes} |"
            yield ""


def _schemas(schema: Mapping[str, Any]) -> Iterable[str]:
    for name, model in sorted(schema.get("components", {}).get("schemas", {}).items()):
        yield f"### {name}"
        yield ""
        if model.get("description"):
            yield _cell(model["description"])
            yield ""
        properties = model.get("properties", {})
        if not properties:
            yield f"Type: {_schema_type(model)}"
            yield ""
            continue
        required = set(model.get("required", ()))
        yield "| Field | Type | Required | Description |"
        yield "|---|---|---|---|"
        for field, spec in properties.items():
            yes = "yes" if field in required else ""
            yield f"| `{field}` | {_schema_type(spec)} | {yes} | {_cell(spec.get('description', ''))} |"
        yield ""


def openapi_markdown() -> str:
    """The HTTP API from the app's OpenAPI schema: each operation, then each body's fields."""
    schema = openapi_schema()
    version = schema["info"].get("version", "")
    return "\n".join(
        [
            f"Generated from `reward-server` {version}'s own OpenAPI document when the site "
            "was built ([openapi.json](openapi.json); a running server serves it at "
            "`/openapi.json` and renders it at `/docs`).",
            "",
            "## Operations",
            "",
            *_operations(schema),
            "## Schemas",
            "",
            *_schemas(schema),
        ]
    )


#: What each ``<!-- gen:NAME -->`` marker of a page becomes.
GENERATORS: dict[str, Callable[[], str]] = {
    "server-flags": server_flags,
    "ppo-keys": ppo_tables,
    "ppo-environment": ppo_environment,
    "models-file": models_file_tables,
    "errors": errors_table,
    "metrics": metrics_table,
    "openapi": openapi_markdown,
}
