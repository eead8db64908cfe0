"""verl 0.9.1's own ``sandbox_fusion`` reward against this server's ``/run_code``: the same
scores as the server's ``verifier: code`` gives the same items through ``/score``.

verl's ``default_compute_score`` (``data_source: codecontests``, ``sandbox_fusion_url`` set,
as its reward managers call it) runs in a subprocess with verl on its PYTHONPATH
(``.venv/verl``, as tests/integration/test_verl.py does: verl pins another transformers than this
venv's). It extracts the program itself, sends one ``/run_code`` request per test and
reads SandboxFusion's answer; its pass rate (of the first 10 tests) must equal the code
verifier's for right, wrong, partly right, crashing and slow programs, in stdin/stdout and
assert-based (``assert_case``) tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.servers import serve
from server_proc import ServerProcess

STDIO = {
    "inputs": ["1 2\n", "10 20\n", "-5 5\n", "7 0\n"],
    "outputs": ["3\n", "30\n", "0\n", "7\n"],
}
ASSERTS = {"assert_case": ["assert f(1) == 2", "assert f(2) == 4", "assert f(0) == 1"]}

#: (response, ground truth): verl reads a ```python block.
ITEMS = [
    ("```python\na, b = map(int, input().split())\nprint(a + b)\n```", STDIO),
    ("```python\na, b = map(int, input().split())\nprint(a * b)\n```", STDIO),
    ("```python\na, b = map(int, input().split())\nprint(a + b if b > 0 else 9)\n```", STDIO),
    ("```python\nraise SystemExit(2)\n```", STDIO),
    ("```python\nimport time\ntime.sleep(30)\n```", STDIO),
    ("```python\ndef f(x):\n    return 2 * x\n```", ASSERTS),
    ("```python\ndef f(x):\n    return x + 1\n```", ASSERTS),
]
EXPECTED = [1.0, 0.0, 0.75, 0.0, 0.0, 2 / 3, 2 / 3]

DRIVER = """
import json, sys
from verl.utils.reward_score import default_compute_score

case = json.loads(sys.stdin.read())
scores = [
    default_compute_score(
        "codecontests",
        response,
        json.dumps(truth),
        sandbox_fusion_url=case["url"],
        concurrent_semaphore=None,
        memory_limit_mb=1024,
    )
    for response, truth in case["items"]
]
print(json.dumps(scores))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("code_verl")
    # verl sends its timeout (10 s) as run_timeout: the entry's limits are the ceilings.
    entry = {"name": "code", "kind": "verifier", "verifier": "code", "test_timeout_s": 2.0}
    with serve(models=[{**entry, "timeout_s": 2.0}], folder=folder) as srv:
        yield srv


def test_verl_sandbox_fusion_scores_equal_the_code_verifier_s(
    server: ServerProcess,
    verl_path: str,
    tmp_path: Path,
) -> None:
    # The labels as verl's ground_truth: JSON strings.
    body = {"texts": [r for r, _ in ITEMS], "labels": [json.dumps(t) for _, t in ITEMS]}
    ours = httpx.post(f"{server.url}/score", json=body, timeout=120)
    assert ours.status_code == 200, ours.text
    assert ours.json()["scores"] == pytest.approx(EXPECTED)

    env = {**os.environ, "PYTHONPATH": verl_path}
    case = {"url": f"{server.url}/run_code", "items": ITEMS}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(case),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs == pytest.approx(ours.json()["scores"])
