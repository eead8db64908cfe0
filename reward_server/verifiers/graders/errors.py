"""Why a grade failed, named after the error flags of OpenAI's ``/graders/run`` answer
(``metadata.errors``): each failure is one :class:`GradeFailure` with its flag, and an item
whose grade failed is masked with that flag as its reason (or scores ``on_error``)."""

from __future__ import annotations

from reward_server.config.graders import GRADER_FLAGS, GraderFlag

__all__ = ["GRADER_FLAGS", "GradeFailure", "GraderFlag"]


class GradeFailure(Exception):
    """A grade that could not be computed: ``flag`` (one of :data:`GRADER_FLAGS`) and a
    one-line ``detail`` for the log and the answer's details."""

    def __init__(self, flag: GraderFlag, detail: str) -> None:
        super().__init__(f"{flag}: {detail}")
        self.flag: GraderFlag = flag
        self.detail = detail
