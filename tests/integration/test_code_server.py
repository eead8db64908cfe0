"""Code rewards in a real server: ``verifier: code`` entries scoring programs in Python, C++
and JavaScript against the label's tests in every format, each program in the sandbox.

Right, wrong, partly right, slow, crashing and non-compiling programs get the scores and
the per-test verdicts they should; an unusable label is the item's error; a language the
entry does not allow is a compile error; a GRPO-style request of 64 items is scored with
the tests of each item running in parallel (seen in the server's process tree: several
programs of one item alive at once).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from helpers.servers import serve
from server_proc import ServerProcess

from reward_server.sandbox import Sandbox

#: Each test's time limit: what the slow programs wait for, and what the others' runs must
#: stay under on a loaded machine (make test once saw a node.js run of the partial program
#: take over 2 s beside the other workers' servers).
TEST_TIMEOUT_S = 5.0
STDIO = {"inputs": ["1 2\n", "10 20\n", "-5 5\n"], "outputs": ["3\n", "30\n", "0\n"]}

#: Per language: (response, expected verdicts of STDIO's three tests).
PROGRAMS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "python": {
        "right": ("a, b = map(int, input().split())\nprint(a + b)\n", ["passed"] * 3),
        "partial": (
            "a, b = map(int, input().split())\nprint(a + b if a > 0 else 7)\n",
            ["passed", "passed", "wrong_answer"],
        ),
        "wrong": ("a, b = map(int, input().split())\nprint(a * b)\n", ["wrong_answer"] * 3),
        "slow": ("import time\ntime.sleep(60)\n", ["timeout"] * 3),
        "crash": ("raise ValueError('no')\n", ["runtime_error"] * 3),
        "broken": ("print(\n", ["compile_error"] * 3),
    },
    "cpp": {
        "right": (
            "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
            'std::cout << a + b << "\\n"; }\n',
            ["passed"] * 3,
        ),
        "partial": (
            "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
            'std::cout << (a > 0 ? a + b : 7) << "\\n"; }\n',
            ["passed", "passed", "wrong_answer"],
        ),
        "wrong": (
            "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
            'std::cout << a * b << "\\n"; }\n',
            ["wrong_answer"] * 3,
        ),
        "slow": ("#include <unistd.h>\nint main() { sleep(60); }\n", ["timeout"] * 3),
        "crash": ("#include <cstdlib>\nint main() { std::abort(); }\n", ["runtime_error"] * 3),
        "broken": ("int main( {\n", ["compile_error"] * 3),
    },
    "javascript": {
        "right": (
            "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/)"
            ".map(Number);\nconsole.log(a + b);\n",
            ["passed"] * 3,
        ),
        "partial": (
            "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/)"
            ".map(Number);\nconsole.log(a > 0 ? a + b : 7);\n",
            ["passed", "passed", "wrong_answer"],
        ),
        "wrong": (
            "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/)"
            ".map(Number);\nconsole.log(a * b);\n",
            ["wrong_answer"] * 3,
        ),
        "slow": ("setTimeout(() => {}, 60000);\n", ["timeout"] * 3),
        "crash": ("throw new Error('no');\n", ["runtime_error"] * 3),
        # JavaScript has no build step: a syntax error shows when the program runs.
        "broken": ("console.log(;\n", ["runtime_error"] * 3),
    },
}
TAGS = {"python": "python", "cpp": "cpp", "javascript": "js"}


def fenced(language: str, code: str) -> str:
    return f"Here is my solution.\n\n```{TAGS[language]}\n{code}```\n\nIt reads the input."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    reason = Sandbox.probe()
    assert reason is None, f"no sandbox on this machine: {reason}"
    folder = tmp_path_factory.mktemp("code")
    code = {"kind": "verifier", "verifier": "code", "test_timeout_s": TEST_TIMEOUT_S}
    models = [
        {"name": "code", **code, "languages": ["python", "cpp", "javascript"]},
        {
            "name": "strict",
            **code,
            "score": "all_pass",
            "stop_on_failure": True,
            "float_tolerance": 1e-6,
            "parallel_tests": 1,
            "on_error": -1.0,
        },
    ]
    with serve(models=models, folder=folder) as srv:
        yield srv


def score(server: ServerProcess, responses: list[str], labels: list[Any], model: str) -> dict:
    body = {"texts": responses, "labels": labels, "model": model}
    answer = httpx.post(f"{server.url}/score", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("language", list(PROGRAMS))
def test_programs_of_every_kind_get_their_verdicts(server: ServerProcess, language: str) -> None:
    cases = PROGRAMS[language]
    responses = [fenced(language, code) for code, _ in cases.values()]
    answer = score(server, responses, [STDIO] * len(cases), "code")
    verdicts = answer["tests"]["code"]
    assert dict(zip(cases, verdicts, strict=True)) == {k: v for k, (_, v) in cases.items()}
    expected = [sum(v == "passed" for v in want) / 3 for _, want in cases.values()]
    assert answer["scores"] == pytest.approx(expected)
    assert answer["objectives"]["passed"] == [3 * s for s in expected]
    assert answer["objectives"]["total"] == [3.0] * len(cases)
    assert "verifier_errors" not in answer


def test_call_based_tests(server: ServerProcess) -> None:
    label = {"fn_name": "add", "inputs": [[1, 2], [3, 4], [[1], [2]]], "outputs": [3, [7], [1, 2]]}
    leetcode = {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9]], "outputs": [[0, 1]]}
    responses = [
        "```python\ndef add(a, b):\n    return a + b\n```",
        "```python\ndef add(a, b):\n    return a - b if isinstance(a, int) else a + b\n```",
        "```python\ndef add(a, b):\n    raise RuntimeError\n```",
        "```python\nimport sys\nsys.exit(0)\n```",  # exits before the call: no pass
        "```python\nclass Solution:\n    def twoSum(self, nums: List[int], t: int) -> List[int]:"
        "\n        return [0, 1]\n```",
    ]
    answer = score(server, responses, [label, label, label, label, leetcode], "code")
    assert answer["tests"]["code"] == [
        ["passed"] * 3,
        ["wrong_answer", "wrong_answer", "passed"],
        ["runtime_error"] * 3,
        ["runtime_error"] * 3,
        ["passed"],
    ]
    assert answer["scores"] == pytest.approx([1.0, 1 / 3, 0.0, 0.0, 1.0])


def test_assert_based_tests(server: ServerProcess) -> None:
    humaneval = {
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == 9\n",
        "entry_point": "square",
    }
    verl = {
        "assert_case": ["assert square(2) == 4", "assert square(3) == 9", "assert square(0) == 1"]
    }
    right = "```python\ndef square(x):\n    return x * x\n```"
    early = "```python\nimport os\nos._exit(0)\n```"
    broken = "```python\ndef square(x) return x\n```"
    answer = score(
        server,
        [right, early, right, broken],
        [humaneval, humaneval, json.dumps(verl), verl],
        "code",
    )
    assert answer["tests"]["code"] == [
        ["passed"],
        ["runtime_error"],
        ["passed", "passed", "wrong_answer"],
        ["compile_error"] * 3,
    ]
    assert answer["scores"] == pytest.approx([1.0, 0.0, 2 / 3, 0.0])


def test_unusable_labels_and_refused_languages(server: ServerProcess) -> None:
    right = fenced("python", PROGRAMS["python"]["right"][0])
    ruby = "```ruby\nputs gets.split.map(&:to_i).sum\n```"
    call = {"fn_name": "f", "inputs": [[1]], "outputs": [1]}
    cpp_for_call = fenced("cpp", "int f(int x) { return x; }\n")
    answer = score(
        server,
        [right, right, ruby, cpp_for_call],
        [{"answer": 3}, "not json", STDIO, call],
        "code",
    )
    assert answer["verifier_errors"]["code"] == ["error", "error", None, None]
    assert answer["tests"]["code"] == [None, None, ["compile_error"] * 3, ["compile_error"]]
    # No tests to run: no reward, so the item is masked (on_error: mask, the default).
    assert answer["scores"] == [None, None, 0.0, 0.0]
    assert answer["masked"] == ["error", "error", None, None]


def test_all_pass_stop_on_failure_and_float_tolerance(server: ServerProcess) -> None:
    floats = {"inputs": ["1\n", "3\n"], "outputs": ["0.3333333333\n", "1.0\n"]}
    close = "```python\nn = int(input())\nprint(f'{n / 3:.9f}')\n```"
    responses = [close, fenced("python", PROGRAMS["python"]["partial"][0])]
    answer = score(server, responses, [floats, STDIO], "strict")
    assert answer["scores"] == [1.0, 0.0]  # all_pass: 2 of 3 is 0
    assert answer["tests"]["strict"] == [["passed", "passed"], ["passed", "passed", "wrong_answer"]]
    # One test at a time (parallel_tests: 1): after a first failure the others never start.
    first_fails = {"inputs": ["-1 1\n", "1 2\n", "3 4\n"], "outputs": ["0\n", "3\n", "7\n"]}
    answer = score(server, [responses[1]], [first_fails], "strict")
    assert answer["tests"]["strict"] == [["wrong_answer", "skipped", "skipped"]]
    assert answer["objectives"] == {"passed": [0.0], "total": [3.0]}


def test_info_shows_the_entries_as_applied(server: ServerProcess) -> None:
    info = httpx.get(f"{server.url}/info", timeout=30).json()
    code, strict = info["models"]
    assert code["languages"] == ["python", "cpp", "javascript"]
    assert code["parallel_tests"] == len(psutil.Process(server.proc.pid).cpu_affinity() or [1])
    assert code["timeout_s"] == 60.0 and code["test_timeout_s"] == TEST_TIMEOUT_S
    assert code["sandbox"] == "bwrap"
    assert strict["parallel_tests"] == 1 and strict["score"] == "all_pass"
    assert "bwrap" not in code  # a path of the server's machine


def _programs_alive(server: ServerProcess, name: str) -> int:
    """Processes in the server's tree running the compiled program ``name``."""
    count = 0
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if Path(child.exe()).name == name and child.status() != psutil.STATUS_ZOMBIE:
                count += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError):
            continue
    return count


def test_grpo_request_of_64_items_runs_each_item_s_tests_in_parallel(
    server: ServerProcess,
) -> None:
    """8 prompts x 8 responses, each response right, partly right or wrong; every score is
    the pass rate. While an item of slow tests runs, several of its programs are alive at
    once (its tests run in parallel, up to the server's cores)."""
    prompts = [
        {"inputs": [f"{i} {j}\n" for j in range(4)], "outputs": [f"{i + j}\n" for j in range(4)]}
        for i in range(1, 9)
    ]
    programs = [
        ("a, b = map(int, input().split())\nprint(a + b)\n", 1.0),
        ("a, b = map(int, input().split())\nprint(a + b if b % 2 else 0)\n", 0.5),
        ("a, b = map(int, input().split())\nprint(a + b if b == 3 else -1)\n", 0.25),
        ("print('nope')\n", 0.0),
    ]
    responses, labels, expected = [], [], []
    for label in prompts:
        for g in range(8):
            code, rate = programs[g % len(programs)]
            responses.append(fenced("python", code))
            labels.append(label)
            expected.append(rate)
    answer = score(server, responses, labels, "code")
    assert answer["scores"] == pytest.approx(expected)
    assert answer["objectives"]["total"] == [4.0] * 64

    # Parallel tests, seen in the process tree: 4 tests of one item each sleep 1 s.
    sleeper = fenced(
        "cpp",
        "#include <unistd.h>\n#include <iostream>\nint main() { int x; std::cin >> x; "
        'usleep(1000000); std::cout << x << "\\n"; }\n',
    )
    label = {"inputs": [f"{j}\n" for j in range(4)], "outputs": [f"{j}\n" for j in range(4)]}
    result: dict[str, dict] = {}

    def request() -> None:
        result["answer"] = score(server, [sleeper], [label], "code")

    thread = threading.Thread(target=request)
    thread.start()
    most = 0
    while thread.is_alive():
        most = max(most, _programs_alive(server, "main"))
    thread.join()
    assert result["answer"]["tests"]["code"] == [["passed"] * 4]
    cores = len(psutil.Process(server.proc.pid).cpu_affinity() or [1])
    assert most == min(4, cores) if cores > 1 else most == 1
