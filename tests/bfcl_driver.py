"""Give tool-call cases to the Berkeley Function Calling Leaderboard's own checker.

``tests/integration/test_bfcl_agreement.py`` runs this script in a subprocess with
``bfcl-eval`` on its PYTHONPATH (``make setup`` installs it without its pins into
``.venv/bfcl``; the test process never imports it). Usage: ``python bfcl_driver.py
CASES.json RESULT.json``.

Each case holds a label, OpenAI tool specs and the response's calls (OpenAI ``tool_calls``,
or text with tagged JSON calls). The script turns them into what BFCL's evaluation hands its
checker, independently of the verifier under test: the function docs in BFCL's dialect
(``dict``, ``float``, ``required`` always present), the decoded calls as ``[{name: {param:
value}}]``, the possible answers as ``[{name: {param: [allowed...]}}]``; picks the test
category BFCL would file the case under (by the numbers of expected calls and of functions);
and runs ``bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker`` unmodified, with its
real imports (model registry included). Irrelevance cases (no call expected) are decided as
BFCL's evaluation runner decides them: valid when ``bfcl_eval.utils.is_empty_output`` says
the decoded output holds no call. The result file maps each case's name to ``{"valid",
"error_type"}``, with the bfcl-eval version.
"""

from __future__ import annotations

import json
import os
import re
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

# bfcl_eval's eval_config makes result/, score/ and .file_locks/ under its project root when
# imported: a folder beside the result file, not the installed package's.
os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(sys.argv[2]).resolve().parent / "bfcl"))

from bfcl_eval.constants.enums import Language
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
from bfcl_eval.utils import is_empty_output

#: A function-calling model of BFCL's registry (its config says underscore_to_dot: BFCL reads
#: the expected ``a.b`` as ``a_b``, the name an OpenAI-style API lets a model call).
MODEL = "gpt-4o-2024-11-20-FC"
#: JSON Schema's type names in BFCL's function-doc dialect.
TYPES = {"object": "dict", "number": "float"}


def bfcl_schema(node: Any) -> Any:
    """A JSON schema (or BFCL doc) with BFCL's type names, at every depth."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(out.get("type"), str):
        out["type"] = TYPES.get(out["type"], out["type"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: bfcl_schema(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = bfcl_schema(out["items"])
    return out


def function_doc(spec: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function spec (or a BFCL doc already) as BFCL's function doc."""
    function = spec.get("function", spec)
    parameters = bfcl_schema(function.get("parameters") or {"type": "object"})
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    return {
        "name": function["name"],
        "description": function.get("description", ""),
        "parameters": parameters,
    }


def decoded_call(item: dict[str, Any]) -> dict[str, Any]:
    function = item.get("function", item)
    arguments = function.get("arguments", function.get("parameters"))
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    return {function["name"]: arguments or {}}


def model_output(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The response's calls as BFCL's decoder leaves them: ``[{name: {param: value}}]``."""
    if case["calls"]:
        return [decoded_call(item) for item in case["calls"]]
    tags = case["tags"]
    if tags is None or not case["text"]:
        return []
    pattern = re.escape(tags[0]) + "(.*?)" + re.escape(tags[1])
    calls: list[dict[str, Any]] = []
    for body in re.findall(pattern, case["text"], flags=re.DOTALL):
        value = json.loads(body)
        calls.extend(decoded_call(v) for v in (value if isinstance(value, list) else [value]))
    return calls


def possible_answer(label: Any) -> list[dict[str, Any]]:
    """The label as BFCL's possible answers; a plain call's values become one-value lists."""
    if isinstance(label, dict):
        label = label["ground_truth"]
    answers = []
    for entry in label:
        if "arguments" in entry:
            answers.append({entry["name"]: {k: [v] for k, v in entry["arguments"].items()}})
        else:
            answers.append(entry)
    return answers


def category(expected: int, functions: int) -> str:
    """The BFCL test category a case with these numbers of calls and functions belongs to."""
    if expected > 1:
        return "parallel_multiple" if functions > 1 else "parallel"
    return "multiple" if functions > 1 else "simple"


def verdict(case: dict[str, Any]) -> dict[str, Any]:
    docs = [function_doc(spec) for spec in case["tools"]]
    output = model_output(case)
    answers = possible_answer(case["label"])
    if not answers:  # irrelevance: BFCL's runner, not its ast_checker, decides it
        empty = bool(is_empty_output(output))
        return {
            "valid": empty,
            "error_type": None if empty else "irrelevance_error:decoder_success",
        }
    test_category = category(len(answers), len(docs))
    result = ast_checker(docs, output, answers, Language.PYTHON, test_category, MODEL)
    valid = bool(result["valid"])
    return {"valid": valid, "error_type": None if valid else result.get("error_type")}


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    result = {
        "bfcl_eval": version("bfcl-eval"),
        "verdicts": {case["name"]: verdict(case) for case in cases},
    }
    Path(sys.argv[2]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
