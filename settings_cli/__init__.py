"""Command-line flags from a pydantic model's fields, spelt one way for ``reward-server``
(``ServerSettings``) and ``ppo-client train`` (``PPOConfig``).

The spelling, in both commands:

- Field ``max_batch_tokens`` is the flag ``--max-batch-tokens``, also spelt with the field's
  own name, ``--max_batch_tokens`` (as TRL's flags and the YAML keys are); ``--help`` shows
  the first. ``--flag VALUE`` and ``--flag=VALUE`` alike; no abbreviations.
- A boolean is ``--flag`` (on), ``--no-flag`` (off; the opposite of ``--no-x`` is ``--x``), or
  ``--flag VALUE`` with any word pydantic reads as a boolean (true/false, 1/0, yes/no, on/off)
  or another value the field allows (``--bf16 auto``).
- A field that may be unset takes ``none`` (or ``null``, ``~``, an empty value).
- A list field is repeated (``--engine-arg a=1 --engine-arg b=2``); a field that may hold a
  list or a mapping besides a text takes a YAML flow list or mapping (``--report-to "[a, b]"``).
- A field with a fixed set of values lists them (argparse checks the choice).

Values stay text otherwise: pydantic converts and checks them, so a flag gives the same
checks as the environment or the YAML file. Given flags land in the namespace under the
field's name, absent ones not at all (``default=SUPPRESS``), for the command to layer over
its other sources. The help line of a field is its description (the field's docstring),
then its default and environment variable.

Used by ``reward_server.cli`` and ``ppo_client.config``, which may not import each other:
this package imports neither (nor ``reward_client``). Both commands also end their process
the same way, :func:`settings_cli.exit.exit_now`.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = [
    "EPILOG",
    "NONE_WORDS",
    "HelpFormatter",
    "add_flags",
    "flag",
    "spellings",
    "union_members",
]

#: The values that mean "unset" for a field that may be None.
NONE_WORDS = frozenset({"none", "null", "~", ""})

#: The spelling in a sentence, for the commands' ``--help``.
EPILOG = (
    "Flags are also spelt with underscores (--max_length for --max-length); a boolean is "
    "--flag, --no-flag or --flag true|false; a flag whose default is none takes none; a "
    "list flag may be repeated."
)


def flag(name: str) -> str:
    """The flag of field ``name`` as ``--help`` shows it: ``max_length`` -> ``--max-length``."""
    return "--" + name.replace("_", "-")


def union_members(annotation: Any) -> list[Any]:
    """The alternatives of a union annotation (or the annotation itself)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def spellings(name: str) -> list[str]:
    """The flags of field ``name``: ``--max-length`` and ``--max_length`` (one for a one-word
    name), the first as ``--help`` shows it."""
    return list(dict.fromkeys([flag(name), f"--{name}"]))


def _negations(name: str) -> list[str]:
    """The flags that turn boolean ``name`` off: ``--no-x`` (``--x`` for ``no_x``)."""
    if name.startswith("no_"):
        return spellings(name.removeprefix("no_"))
    return spellings(f"no_{name}")


#: What a boolean flag given without a value receives (a value may convert to None).
_BARE = object()


class _Switch(argparse.Action):
    """A boolean flag: ``--flag`` is True, ``--flag VALUE`` the value, ``--no-flag`` False."""

    def __init__(self, option_strings: list[str], negations: Sequence[str], **kwargs: Any) -> None:
        super().__init__([*option_strings, *negations], nargs="?", const=_BARE, **kwargs)
        self.negations = frozenset(negations)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string in self.negations:
            if values is not _BARE:
                parser.error(f"{option_string} takes no value")
            values = False
        setattr(namespace, self.dest, True if values is _BARE else values)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, each flag shown in its one spelling (the dashed one) and a boolean
    with its ``--no-`` form: ``--merge-adapter [BOOL], --no-merge-adapter``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [s for s in action.option_strings if "_" not in s]
        if isinstance(action, _Switch):
            on = next(s for s in shown if s not in action.negations)
            off = [s for s in shown if s in action.negations]
            return ", ".join([f"{on} [{action.metavar}]", *off])
        if not shown or shown == action.option_strings:
            return super()._format_action_invocation(action)
        metavar = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(f"{s} {metavar}" for s in shown)


def _value(members: Sequence[Any]) -> Callable[[str], Any]:
    """argparse ``type`` for a field whose annotation has these union ``members``: the text,
    or None for a null word where None is allowed, or a YAML flow list or mapping where the
    field may hold one besides a text."""
    nullable = type(None) in members
    origins = {typing.get_origin(m) or m for m in members}
    opening = tuple(bracket for kind, bracket in ((list, "["), (dict, "{")) if kind in origins)

    def convert(text: str) -> Any:
        if nullable and text.strip().lower() in NONE_WORDS:
            return None
        if opening and text.lstrip().startswith(opening):
            try:
                return yaml.safe_load(text)
            except yaml.YAMLError:
                return text
        return text

    return convert


_METAVARS = {int: "INT", float: "FLOAT", bool: "BOOL", list: "LIST", dict: "MAPPING"}


def _metavar(members: Sequence[Any], name: str) -> str:
    """``int | None`` -> ``INT``; ``bool | Literal["auto"]`` -> ``BOOL|auto`` (a text field
    shows its name instead: ``--model MODEL``)."""
    words: list[str] = []
    for member in members:
        if typing.get_origin(member) is Literal:
            words += [str(arg) for arg in typing.get_args(member)]
        elif member is not type(None):
            words.append(_METAVARS.get(typing.get_origin(member) or member, "TEXT"))
    metavar = "|".join(dict.fromkeys(words))
    return name.upper() if metavar == "TEXT" else metavar


def _default_text(field: FieldInfo) -> str:
    """``default: X`` as ``--help`` says it (a field's ``default_label`` if it has one)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    label = extra.get("default_label")
    if field.is_required():
        return "required"
    if isinstance(label, str):
        return f"default: {label}"
    default = field.get_default(call_default_factory=True)
    if isinstance(default, bool):
        return f"default: {'on' if default else 'off'}"
    if default is None or default in ([], {}):
        return "default: none"
    return f"default: {default}"


def add_flags(
    container: argparse._ActionsContainer,
    model: type[BaseModel],
    *,
    env_prefix: str | None = None,
) -> None:
    """Add a flag for every field of ``model`` to ``container`` (a parser or a group); with
    ``env_prefix``, each help line names the field's environment variable."""
    for name, field in model.model_fields.items():
        members = union_members(field.annotation)
        details = [_default_text(field)]
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        only_literals = all(typing.get_origin(m) is Literal for m in members)
        choices = [arg for m in members for arg in typing.get_args(m)] if only_literals else []
        if choices and all(isinstance(choice, str) for choice in choices):
            kwargs["choices"] = choices
        elif [typing.get_origin(m) for m in members if m is not type(None)] == [list]:
            (items,) = [m for m in members if m is not type(None)]
            kwargs.update(action="append", metavar=_metavar(typing.get_args(items), name))
            details.append("repeatable")
        else:
            kwargs["metavar"] = _metavar(members, name)
        if "action" not in kwargs:
            kwargs["type"] = _value(members)
        if env_prefix is not None:
            details.append(f"env {env_prefix}{name.upper()}")
        description = " ".join((field.description or "").split())
        kwargs["help"] = f"{description} [{'; '.join(details)}]".replace("%", "%%")
        if bool in members:
            container.add_argument(
                *spellings(name), action=_Switch, negations=_negations(name), **kwargs
            )
        else:
            container.add_argument(*spellings(name), **kwargs)
