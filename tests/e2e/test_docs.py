"""The documentation site is checked like code.

- ``mkdocs build --strict`` passes (offline: no fonts or CDN), and a broken internal link in
  a scratch copy of the docs makes it fail.
- The reference tables are generated from the code: a settings class with one more field
  gets one more row, with no hand edit.
- Every fenced block marked ``<!-- run -->`` on the line before it runs (shell blocks in
  bash, Python blocks in this interpreter), against a real server of a tiny model whose URL
  is in ``REWARD_URL`` (a block that starts a server of its own gets a free ``PORT``): only
  blocks that need no GPU and no hub download carry the marker. Every other bash, Python,
  YAML and JSON block still parses, and names only flags, config keys and imports that
  exist (its models and tenants files parse as the server would).
- Every section the README had before it became a front page has a heading in the site.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from pydantic import Field
from server_proc import ServerProcess, free_port

from ppo_client.config import PPOConfig
from reward_server.config.entries import SequenceEntry
from reward_server.config.models_file import KINDS, parse_models_file
from reward_server.config.settings import ENV_PREFIX, ServerSettings
from reward_server.config.tenants import parse_tenants_file
from reward_server.http.errors import ERRORS
from reward_server.top.cli import build_parser as build_top_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
BIN = Path(sys.executable).parent
MKDOCS = BIN / "mkdocs"
sys.path.insert(0, str(DOCS))

import gen_reference  # noqa: E402  (docs/ is put on the path just above)

#: The ``## `` and ``### `` headings of README.md before its sections moved into the site
#: (``git show 2467046:README.md``); each must still be a heading of some docs page.
OLD_README_HEADINGS = [
    "Why",
    "Two commands",
    "What `make demo` does",
    "Serving a real reward model",
    "Training a real policy against it",
    "Server",
    "Flags",
    "Endpoints",
    "Labels: references for verifiers",
    "Errors",
    "Metrics",
    "Training: PPO against the reward server",
    "Command line",
    "Python",
    "Long runs: when the reward server goes away",
    "What the reward function receives",
    "Configuration keys",
    "Outputs",
    "Rollouts on vLLM",
    "Where this differs from TRL's PPOTrainer (on purpose)",
    "Using the server from TRL's GRPO/RLOO, OpenRLHF and verl",
    "Engines",
    "A 70B reward model over several GPUs",
    "Protocols",
    "Composite rewards",
    "The client side",
    "Process reward models",
    "Verifiers: rule-based rewards beside the models",
    "Judges: a causal LM that reads a rubric",
    "Remote components: another service as one of the models",
    "Scaling out",
    "Kubernetes",
    "Ray Serve",
    "Clients that follow replicas (`dns+http://`)",
    "Docker",
    "The demo in a container",
    "Serving a reward model",
    "Training against it",
    "API key",
    "GPUs",
    "Several server replicas",
    "What is tested without a Docker engine",
    "Reliability",
    "Last soak run",
    "What the tests check",
    "Troubleshooting",
    "Architecture",
    "Development",
]


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the site whose mkdocs.yml is in ``root``, into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = mkdocs_build(REPO, site)
    assert result.returncode == 0, result.stderr[-5000:]
    return site


# --------------------------------------------------------------------------- the build


def test_the_strict_build_passes_with_generated_reference_pages(site: Path) -> None:
    flags = (site / "reference" / "server-flags.html").read_text()
    assert "--max-batch-tokens" in flags and "REWARD_SERVER_MAX_BATCH_TOKENS" in flags
    ppo = (site / "reference" / "ppo-config.html").read_text()
    assert (
        "reward_retry_timeout" in ppo
        and "REWARD_URL" in (site / "reference" / "server-flags.html").read_text()
    )
    assert "step_aggregate" in (site / "reference" / "models-file.html").read_text()
    assert "queue_full" in (site / "reference" / "errors.html").read_text()
    assert "reward_server_queue_items" in (site / "reference" / "metrics.html").read_text()
    api = (site / "reference" / "http-api.html").read_text()
    assert "POST /score" in api and "ScoreRequest" in api
    # The OpenAPI document is the app's own, written at build time.
    assert '"/score"' in (site / "reference" / "openapi.json").read_text()
    # mkdocstrings rendered the Python API.
    assert "AsyncRewardClient" in (site / "api" / "reward_client.html").read_text()


def test_the_built_site_works_opened_from_disk(site: Path) -> None:
    """Every page's links and images name files of the site (use_directory_urls: false), so
    site/index.html opened with no server (file://) navigates; 404.html alone is absolute."""
    missing, checked = [], 0
    for page in site.rglob("*.html"):
        if page.name == "404.html":
            continue
        for ref in re.findall(r'(?:href|src)="([^"]+)"', page.read_text(encoding="utf-8")):
            target = ref.split("#")[0].split("?")[0]
            if not target or re.match(r"^(\w+:|//)", ref):
                continue
            checked += 1
            if not (page.parent / target).is_file():
                missing.append(f"{page.relative_to(site)}: {ref}")
    assert checked > 1000 and not missing, missing[:20]


def test_pictures_are_in_the_site(site: Path) -> None:
    bench = (site / "benchmarks.html").read_text()
    charts = re.findall(r'src="(charts/[^"]+\.svg)"', bench)
    assert {Path(c).name.rsplit("-", 1)[-1] for c in charts} >= {"throughput.svg", "latency.svg"}
    for chart in charts:
        assert (site / chart).read_text().lstrip().startswith("<?xml")
    quick = (site / "quickstart.html").read_text()
    assert "images/reward_curve.png" in quick
    assert (site / "images" / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    architecture = (site / "architecture.html").read_text()
    assert architecture.count('class="mermaid"') >= 2


def test_a_broken_internal_link_fails_the_strict_build(tmp_path: Path) -> None:
    """A scratch copy of the site's sources, one link pointed at a page that is not there."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copy(REPO / "BENCHMARKS.md", tmp_path)
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "bench" / "results", tmp_path / "bench" / "results")
    for package in ("reward_client", "reward_server", "ppo_client"):
        (tmp_path / package).symlink_to(REPO / package)
    page = tmp_path / "docs" / "quickstart.md"
    text = page.read_text()
    assert "(../reference/server-flags.md)" not in text
    page.write_text(text.replace("](guides/ppo.md", "](guides/no-such-page.md", 1))
    assert page.read_text() != text
    result = mkdocs_build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    # It fails for that link alone: the copy is otherwise the site that builds.
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert warnings, result.stderr[-3000:]
    assert all("no-such-page.md" in line for line in warnings), warnings


# ------------------------------------------------------------ generated from the code


class _MoreSettings(ServerSettings):
    docs_probe_limit: int = Field(default=7, ge=1)
    """A setting added after the docs were written."""


class _MoreKeys(PPOConfig):
    docs_probe_key: float = 0.5
    """A run key added after the docs were written."""


class _MoreModelKeys(SequenceEntry):
    docs_probe_entry: str = "x"


def test_a_new_setting_gets_its_row_with_no_hand_edit() -> None:
    table = gen_reference.flags_table(_MoreSettings, ENV_PREFIX)
    row = next(line for line in table.splitlines() if "--docs-probe-limit" in line)
    assert "`REWARD_SERVER_DOCS_PROBE_LIMIT`" in row and "`7`" in row and "added after" in row
    assert "docs-probe" not in gen_reference.server_flags()
    keys = gen_reference.keys_table(_MoreKeys, flags=True)
    row = next(line for line in keys.splitlines() if "`docs_probe_key`" in line)
    assert "`--docs_probe_key`" in row and "`0.5`" in row and "added after" in row
    entry = gen_reference.keys_table(_MoreModelKeys)
    assert any("`docs_probe_entry`" in line for line in entry.splitlines())


def test_the_generated_tables_cover_the_code() -> None:
    flags = gen_reference.server_flags()
    for name in ServerSettings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in flags
        assert f"`{ENV_PREFIX}{name.upper()}`" in flags
    assert "`--max-batch-tokens` | `REWARD_SERVER_MAX_BATCH_TOKENS`" in flags
    keys = gen_reference.ppo_tables()
    assert all(f"`{name}`" in keys for name in PPOConfig.field_names())
    entries = gen_reference.models_file_tables()
    for kind in KINDS:  # every key of every kind (the kind, verifier and mode name their tables)
        keys = set(kind.model_fields) - {"kind", "verifier", "mode"}
        assert all(f"`{name}`" in entries for name in keys), kind
        assert kind.SELECTOR in entries
    errors = gen_reference.errors_table()
    assert all(f"`{kind}`" in errors for _, kind in ERRORS.values())


# --------------------------------------------------------------------- runnable blocks


class Block(NamedTuple):
    page: str
    line: int
    language: str
    code: str
    runnable: bool = False  # marked <!-- run --> on the line before it


RUN_MARKER = "<!-- run -->"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def all_blocks() -> list[Block]:
    """Every fenced block with a language, in every page under docs/, the README and
    BENCHMARKS.md (which the site includes)."""
    blocks = []
    for path in [*sorted(DOCS.rglob("*.md")), REPO / "README.md", REPO / "BENCHMARKS.md"]:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            page = str(path.relative_to(DOCS if path.is_relative_to(DOCS) else REPO))
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            runnable = before.strip() == RUN_MARKER
            blocks.append(Block(page, line, match.group(1), match.group(2), runnable))
    return blocks


#: The runnable blocks (only pages under docs/ carry the marker).
BLOCKS = [block for block in all_blocks() if block.runnable]


def _syntax_error(block: Block) -> str | None:
    """Why ``block`` does not parse in its language, or None (no parser: None)."""
    try:
        if block.language == "python":
            ast.parse(block.code)
        elif block.language == "yaml":
            list(yaml.safe_load_all(block.code))
        elif block.language == "json":
            json.loads(block.code)
        elif block.language in ("bash", "sh", "shell"):
            check = subprocess.run(
                ["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=30
            )
            return check.stderr.strip() or None if check.returncode else None
    except (SyntaxError, yaml.YAMLError, json.JSONDecodeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def test_every_code_block_parses_in_its_language() -> None:
    """Blocks that do not run here (a GPU, a hub model, a cluster) still parse: a comment
    that lost its ``#``, an unclosed quote or a placeholder the shell reads fails."""
    blocks = all_blocks()
    assert sum(b.language in ("bash", "python", "yaml") for b in blocks) >= 50
    errors = [f"{b.page}:{b.line} ({b.language}): {e}" for b in blocks if (e := _syntax_error(b))]
    assert not errors, "\n".join(errors)


def test_a_comment_without_its_hash_is_a_syntax_error() -> None:
    yaml_block = Block("x.md", 1, "yaml", " models.yaml: the models\nmodels:\n  - name: rm\n")
    python_block = Block("x.md", 1, "python", "x = 1\n A rule:\ndef f(): pass\n")
    shell_block = Block("x.md", 1, "bash", "KEY=<one tenant's key> run\n")
    assert all(_syntax_error(b) for b in (yaml_block, python_block, shell_block))
    assert _syntax_error(yaml_block._replace(code="# models.yaml\nmodels: []\n")) is None


#: Flags of ``reward-server`` in the examples that are not settings.
CLI_ONLY_FLAGS = {"--help"}
#: Flags of ``reward-server top``.
TOP_FLAGS = {flag for action in build_top_parser()._actions for flag in action.option_strings}


def _commands(code: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments dropped."""
    return [line.split(" #")[0] for line in code.replace("\\\n", " ").splitlines()]


def stale_names(block: Block) -> list[str]:
    """What ``block`` names that the code does not have: a ``reward-server`` flag that is no
    setting, a ``ppo-client train --key`` or PPO-config YAML key that is no config key, a
    models file or tenants file the server would refuse."""
    flags = {f"--{name.replace('_', '-')}" for name in ServerSettings.model_fields}
    keys = set(PPOConfig.field_names())
    stale: list[str] = []
    if block.language in ("bash", "sh", "shell"):
        for command in _commands(block.code):
            top = re.search(r"(?:^|[\s;&|(])reward-server\s+top\s+(.*)", command)
            if top:  # the live view's own flags
                args = re.split(r"[|;&]", top.group(1))[0]
                given = re.findall(r"(?<!\S)(--[a-z][\w-]*)", args)
                stale += [f for f in given if f not in TOP_FLAGS]
            server = re.search(r"(?:^|[\s;&|(])reward-server\s+(?!hash-key|top\s)(.*)", command)
            if server:
                args = re.split(r"[|;&]", server.group(1))[0]
                given = re.findall(r"(?<!\S)(--[a-z][\w-]*)", args)
                stale += [f for f in given if f not in flags | CLI_ONLY_FLAGS]
            train = re.search(r"ppo[-_]client train\s+(.*)", command)
            if train:
                given = re.findall(r"(?<!\S)--(\w+)", train.group(1))
                stale += [f"--{k}" for k in given if k not in keys | {"config"}]
    elif block.language == "yaml":
        data = yaml.safe_load(block.code)
        try:
            if isinstance(data, dict) and "models" in data:
                parse_models_file(data)
            elif isinstance(data, dict) and "tenants" in data:
                parse_tenants_file(data)
            elif isinstance(data, list):  # entries of a models file shown alone
                parse_models_file({"models": data})
            elif isinstance(data, dict):  # a PPO config
                stale += [k for k in data if k not in keys]
        except ValueError as e:
            stale.append(str(e).splitlines()[0])
    return stale


def test_the_flags_and_keys_the_docs_name_exist() -> None:
    """The examples are checked against the code: a renamed flag or key, or a models file
    the server would refuse, fails here even where the example cannot run."""
    blocks = all_blocks()
    checked = [b for b in blocks if b.language == "yaml" or "reward-server" in b.code]
    assert len(checked) >= 30
    stale = [f"{b.page}:{b.line}: {s}" for b in blocks for s in stale_names(b)]
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize(
    ("language", "code", "found"),
    [
        ("bash", "reward-server --model m --max-batch-tokenz 9 &\n", "--max-batch-tokenz"),
        ("bash", "reward-server top http://h:8000 --intervall 5\n", "--intervall"),
        (
            "bash",
            "accelerate launch -m ppo_client train --config c.yaml \\\n  --kl_coeff 1\n",
            "--kl_coeff",
        ),
        ("yaml", "model_name_or_path: m\nreward_urls: [u]\n", "reward_urls"),
        ("yaml", "models:\n  - name: a\n    kind: verifier\n", "verifier"),
        ("yaml", "- name: a\n  model: m\n  weigth: 1\n", "weigth"),
        ("yaml", "tenants:\n  - name: a\n    key_sha256: k\n", "hex"),
    ],
)
def test_a_stale_name_in_an_example_is_found(language: str, code: str, found: str) -> None:
    stale = stale_names(Block("x.md", 1, language, code))
    assert len(stale) == 1 and found in stale[0], stale


def missing_imports(block: Block) -> list[str]:
    """The names a Python block imports from this project's packages that do not exist."""
    missing = []
    for node in ast.walk(ast.parse(block.code)):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.split(".")[0] not in ("reward_client", "reward_server", "ppo_client"):
            continue
        module = importlib.import_module(node.module)
        for alias in node.names:
            if not hasattr(module, alias.name) and not importlib.util.find_spec(
                f"{node.module}.{alias.name}"
            ):
                missing.append(f"{node.module}.{alias.name}")
    return missing


def test_the_python_examples_import_what_exists() -> None:
    blocks = [b for b in all_blocks() if b.language == "python"]
    assert sum("from reward_client import" in b.code for b in blocks) >= 3
    missing = [f"{b.page}:{b.line}: {name}" for b in blocks for name in missing_imports(b)]
    assert not missing, missing
    gone = Block("x.md", 1, "python", "from reward_client import RewardClient, RemoteScorer\n")
    assert missing_imports(gone) == ["reward_client.RemoteScorer"]


def test_flags_and_keys_that_exist_are_not_stale() -> None:
    code = (
        "reward-server --model m --max-batch-tokens 9 --help\nppo-client train --kl_coef 1\n"
        "reward-server top http://h:8000 --interval 5 --once\n"
    )
    assert stale_names(Block("x.md", 1, "bash", code)) == []
    assert stale_names(Block("x.md", 1, "yaml", "reward_url: u\nkl_coef: 0.1\n")) == []


def test_the_guides_have_runnable_blocks() -> None:
    languages = {block.language for block in BLOCKS}
    assert len(BLOCKS) >= 5 and {"bash", "python"} <= languages, BLOCKS


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.line}" for b in BLOCKS])
def test_runnable_block(block: Block, bert_server: ServerProcess, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "REWARD_URL": bert_server.url,
        # For a block that starts a server of its own (on ${PORT:-8000} in the guide).
        "PORT": str(free_port()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    if block.language in ("bash", "sh", "shell"):
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    elif block.language == "python":
        cmd = [sys.executable, "-c", block.code]
    else:
        pytest.fail(f"{block.page}:{block.line}: no runner for {block.language} blocks")
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        f"{block.page}:{block.line} failed:\n{result.stdout}\n{result.stderr[-3000:]}"
    )


# ------------------------------------------------------------- the README's old sections


def _headings() -> set[str]:
    found = set()
    for path in DOCS.rglob("*.md"):
        text = FENCE.sub("", path.read_text(encoding="utf-8"))  # no "# comment" in code
        found |= {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}
    return found


def test_every_section_of_the_old_readme_has_a_home_in_the_site() -> None:
    headings = _headings()
    missing = [heading for heading in OLD_README_HEADINGS if heading not in headings]
    assert not missing, f"old README sections with no heading in docs/: {missing}"
