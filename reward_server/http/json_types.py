"""The JSON types of the request bodies, as JSON Schema states them: strings that are
Unicode text, integers (3.0 is one; "3" and true are not), numbers (never "3" or true), and
fields of several JSON types told apart by the value's type (:func:`one_of`)."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
)

__all__ = ["Integer", "Number", "StrList", "Text", "integer", "one_of"]


def _encodable(value: str) -> str:
    """Reject strings that are not valid Unicode text (JSON escapes of lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        # JSON allows "\ud800" alone; no tokenizer can encode it, so it is malformed input.
        raise ValueError(
            f"invalid Unicode: lone surrogate {value[exc.start]!r} at character {exc.start}"
        ) from None
    return value


#: A string that reaches the tokenizer: strict (no coercion) and valid Unicode.
Text = Annotated[StrictStr, AfterValidator(_encodable)]

#: A non-empty list of strings (numbers, nulls and objects are rejected, not coerced).
StrList = Annotated[list[Text], Field(min_length=1)]


def _whole(value: Any) -> Any:
    """A number without a fraction as an int (JSON Schema's integer: 3.0 is one)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(**constraints: Any) -> Any:
    """An integer as JSON Schema has it (3 or 3.0, never "3" or true), with ``Field``'s
    ``constraints`` (ge=...; inside, so that the schema states them)."""
    return Annotated[Annotated[StrictInt, Field(**constraints)], BeforeValidator(_whole)]


#: An integer as JSON Schema has it: 3 or 3.0, never "3" or true.
Integer = integer()
#: A number: never "3" or true.
Number = StrictFloat


def _json_type(value: Any) -> str | None:
    """The tag of a JSON value's type, for fields that take several (see :func:`one_of`)."""
    if isinstance(value, str):
        return "<string>"
    if isinstance(value, list):
        return "<list>"
    if isinstance(value, dict):
        return "<object>"
    return None


def one_of(what: str, **shapes: Any) -> Any:
    """A field that takes a value of one of several JSON types (``string=``, ``list=``,
    ``object=``), told apart by the value's type: one error naming the field, not one per
    shape it could have had. (The ``<string>``-style tags in an error's location are left
    out of the messages, :func:`reward_server.http.errors.describe_validation`.)"""
    members = tuple(Annotated[shape, Tag(f"<{name}>")] for name, shape in shapes.items())
    return Annotated[
        Union[members],  # noqa: UP007 - a tuple of members, built at run time
        Discriminator(
            _json_type, custom_error_type="wrong_type", custom_error_message=f"must be {what}"
        ),
    ]
