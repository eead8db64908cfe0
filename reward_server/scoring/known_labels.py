"""The label values known before the first event, so that every series of them exists at 0
from the start (:mod:`reward_server.scoring.metrics` and :mod:`reward_server.http.metrics`
make them): a series that first appears at 1 has no earlier sample, and ``rate()`` and
``increase()`` never count that first event.

Known at start: each served model and the reasons its kind can fail or mask with
(:class:`ModelSeries`, from its models-file entry), the tenants in force (:func:`tenant_names`),
the outcomes (:data:`OUTCOMES`); the HTTP layer adds its endpoints, statuses and error types.
Plain data and rules: no registry here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from prometheus_client import Counter, Gauge, Histogram

from reward_server.config.entries import RubricJudge
from reward_server.config.graders import GRADER_FLAGS
from reward_server.config.tenants import DEFAULT_TENANT
from reward_server.scoring.item_result import UNCLOSED_REASONING
from reward_server.scoring.pairwise import NO_OPPONENT, NON_FINITE
from reward_server.scoring.rubric import OUT_OF_RANGE, PARSE_FAILURE, UNCATEGORISED
from reward_server.verifiers import REASONS

if TYPE_CHECKING:
    from reward_server.config.models_file import ModelSpec
    from reward_server.config.tenants import TenantTable

__all__ = ["OUTCOMES", "Labelled", "ModelSeries", "tenant_names", "zeros"]

#: Outcomes of a forward pass and of a reload of the keys file.
OUTCOMES = ("ok", "error")
#: Why a remote component's items fail (:mod:`reward_server.scoring.remote_model`; a remote
#: reward server's own mask reasons come on top, unknown until it gives them).
_REMOTE_REASONS = ("remote_error", "timeout", "parse_failure", "deadline")
#: Why any model's items are masked whatever its on_error: the request's deadline.
_DEADLINE = "deadline"

#: A metric with labels (its children are made by ``labels()``).
Labelled: TypeAlias = Counter | Gauge | Histogram


@dataclass(frozen=True, slots=True)
class ModelSeries:
    """The label values of one served model's series, known from its models-file entry: each
    of its series exists at 0 from the model's start until it counts."""

    name: str
    #: Whether it runs forward passes (its passes, rows, pass time and dropped rows are
    #: counted); verifiers and remote components run none.
    passes: bool = False
    #: Whether the score cache serves it (its hits, misses and duplicates are counted).
    cached: bool = False
    #: The reasons its items can fail with, in ``verifier_errors`` (verifiers, generating
    #: judges) or ``remote_errors``; a pairwise judge's failures are counted only when masked.
    verifier_errors: tuple[str, ...] = ()
    remote_errors: tuple[str, ...] = ()
    #: The reasons its items can be masked with (``masked_items``).
    masked: tuple[str, ...] = (_DEADLINE,)
    #: A rubric judge's categories (its entry's and ``uncategorised``), whose items and
    #: failed items are counted.
    rubric_categories: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: ModelSpec, *, cached: bool) -> ModelSeries:
        """The series of the model ``spec`` serves (``cached``: by the score cache). Its masks
        follow the pipeline's rule (``pipeline._masks``): its failures where its on_error
        masks, the deadline always, an unclosed thinking block where it strips reasoning and
        masks those."""
        failures, counter = _failures(spec)
        masked = dict.fromkeys([*(failures if spec.masks else ()), _DEADLINE])
        if spec.reasoning_mode == "strip" and spec.unclosed_reasoning == "mask":
            masked[UNCLOSED_REASONING] = None
        return cls(
            spec.name,
            passes=spec.kind in ("sequence", "process", "judge"),
            cached=cached,
            verifier_errors=failures if counter == "verifier" else (),
            remote_errors=failures if counter == "remote" else (),
            masked=tuple(masked),
            rubric_categories=_rubric_categories(spec),
        )


def _rubric_categories(spec: ModelSpec) -> tuple[str, ...]:
    """A rubric judge's categories: its entry's, and the one of criteria given by weight."""
    if isinstance(spec, RubricJudge):
        return (*spec.categories, UNCATEGORISED)
    return ()


def _failures(spec: ModelSpec) -> tuple[tuple[str, ...], str | None]:
    """The reasons the items of ``spec``'s kind (and judge mode) can fail with, and which
    counter counts them (a reward model's failure is the request's 500, not an item's)."""
    if spec.kind == "verifier":
        return REASONS, "verifier"
    if spec.kind == "remote":
        return _REMOTE_REASONS, "remote"
    if spec.kind == "grader":
        return (*GRADER_FLAGS, _DEADLINE), "verifier"
    if spec.kind == "judge" and spec.mode == "generate":
        return ("parse_failure",), "verifier"
    if isinstance(spec, RubricJudge):
        if spec.aggregation == "implicit":
            return (PARSE_FAILURE, OUT_OF_RANGE), "verifier"
        return ((PARSE_FAILURE,) if spec.verdict == "generate" else ()), "verifier"
    if spec.kind == "judge" and spec.mode == "pairwise":
        return (NO_OPPONENT, NON_FINITE), None
    return (), None


def zeros(metric: Labelled, label_sets: Iterable[Mapping[str, str]]) -> None:
    """Make ``metric``'s series of each label set (at 0, until something counts)."""
    for labels in label_sets:
        metric.labels(**labels)


def tenant_names(table: TenantTable | None) -> list[str]:
    """The names of the tenants in force: the keys file's, or the default tenant's without
    one (``table`` None: every request is the default tenant)."""
    return table.names if table is not None else [DEFAULT_TENANT.name]
