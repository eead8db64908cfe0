"""The tool_call verifier's table (tests/tool_call_cases.py) against the Berkeley Function
Calling Leaderboard's own checker: every case BFCL's ``ast_checker`` can decide gets the
same verdict from it, and where the verifier differs on purpose (``DIVERGENCES``) BFCL does
decide otherwise.

bfcl-eval pins numpy 1.26 and its checker imports the leaderboard's model registry, which
imports every provider's SDK, so ``make setup`` installs it without its pins, with the
packages that registry imports, into ``.venv/bfcl``, and ``bfcl_driver.py`` runs there in
a subprocess (this process never imports it). Without it these tests skip; ``make test``
sets ``REWARD_SERVER_TEST_BFCL=1`` so that they fail instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.drivers import run_driver
from server_proc import require_counterpart
from tool_call_cases import CASES, DIVERGENCES, Case

from reward_server.verifiers.tool_calls import ToolCallOptions

#: Where `make setup` installs bfcl-eval and what its checker imports (see the Makefile).
BFCL_DIR = Path(sys.prefix) / "bfcl"
BFCL_VERSION = "2026.3.23"
DRIVER = Path(__file__).resolve().parents[1] / "bfcl_driver.py"
DECIDED = [case for case in CASES if case.bfcl]

#: The verifier's reasons that each of BFCL's error kinds (the part of its error_type after
#: the checker's name) may come with. BFCL reports no call where one is expected as a wrong
#: count; a parallel case it cannot match (cannot_find_match) says nothing more.
REASONS_OF = {
    "wrong_count": {"wrong_count", "no_call"},
    "wrong_func_name": {"wrong_function"},
    "missing_required": {"missing_argument"},
    "missing_optional": {"missing_argument"},
    "unexpected_param": {"unexpected_argument"},
    "type_error": {"wrong_type"},
    "value_error": {"wrong_value"},
    "decoder_success": {"unexpected_call"},
}


def reasons_of(error_type: str) -> set[str] | None:
    """The reasons BFCL's ``error_type`` allows; None where it says nothing about them."""
    checker, _, kind = error_type.partition(":")
    key = checker if checker in ("type_error", "value_error") else kind
    return REASONS_OF.get(key)


def driver_case(case: Case) -> dict[str, Any]:
    options = ToolCallOptions(**case.options)
    fields = ("name", "label", "tools", "calls", "text")
    return {"tags": options.tags, **{k: getattr(case, k) for k in fields}}


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """BFCL's verdict on each case of DECIDED and DIVERGENCES (one subprocess run)."""
    require_counterpart(
        (BFCL_DIR / "bfcl_eval" / "__init__.py").is_file(),
        "REWARD_SERVER_TEST_BFCL",
        f"bfcl-eval {BFCL_VERSION} (make setup puts it in {BFCL_DIR})",
    )
    folder = tmp_path_factory.mktemp("bfcl")
    cases = [driver_case(case) for case in DECIDED + DIVERGENCES]
    env = {"BFCL_PROJECT_ROOT": str(folder / "project")}
    result = run_driver(DRIVER, cases, folder, str(BFCL_DIR), env=env, case_name="cases.json")
    assert result["bfcl_eval"] == BFCL_VERSION
    return result["verdicts"]


def test_the_table_has_enough_cases_bfcl_decides() -> None:
    assert len(DECIDED) >= 30
    assert {"simple", "multiple", "parallel", "parallel_multiple", "irrelevance"} <= {
        case.category for case in DECIDED
    }
    assert sum(not case.valid for case in DECIDED) >= 10


@pytest.mark.parametrize("case", DECIDED, ids=lambda case: case.name)
def test_bfcl_gives_the_tables_verdict(case: Case, bfcl: dict[str, Any]) -> None:
    verdict = bfcl[case.name]
    assert verdict["valid"] is case.valid, verdict
    if not case.valid:
        allowed = reasons_of(verdict["error_type"])
        assert allowed is None or case.reason in allowed, verdict


@pytest.mark.parametrize("case", DIVERGENCES, ids=lambda case: case.name)
def test_bfcl_decides_the_documented_divergences_otherwise(
    case: Case, bfcl: dict[str, Any]
) -> None:
    assert case.valid
    assert bfcl[case.name]["valid"] is False, case.note
