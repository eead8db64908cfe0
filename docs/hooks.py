"""MkDocs hooks (``hooks:`` in mkdocs.yml): the parts of the site generated at build time.

- ``<!-- gen:NAME -->`` on a line of its own becomes ``gen_reference.GENERATORS[NAME]()``:
  the flag, key, error, metric and HTTP API tables, read from the code.
- ``<!-- include:PATH -->`` (a file of the repository, e.g. ``BENCHMARKS.md``) becomes that
  file's text; ``from="HEADING"`` / ``until="HEADING"`` keep a part of it.
- ``<!-- gen:bench-charts -->`` shows the newest charts ``make bench`` wrote into
  ``bench/results/``; the hook copies them into the site under ``charts/``.
- ``reference/openapi.json``: the app's OpenAPI document, written into the site.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(DOCS))

import gen_reference  # noqa: E402  (docs/ is put on the path just above)

GEN = re.compile(r"^<!-- gen:([\w-]+) -->$", re.MULTILINE)
INCLUDE = re.compile(r"^<!-- include:(\S+)((?: \w+=\"[^\"]*\")*) -->$", re.MULTILINE)
ARG = re.compile(r"(\w+)=\"([^\"]*)\"")

#: The charts of one results file, by the suffix bench/charts.py gives them.
CHARTS = {
    "throughput": "Throughput against concurrent clients (reward-server and the naive server)",
    "latency": "p50 and p99 request latency against concurrent clients",
    "engines": "Texts per second per engine, dtype and workload",
}


def newest_charts(results: Path = RESULTS) -> dict[str, Path]:
    """The newest chart of each kind in ``results`` (file names start with the date)."""
    found: dict[str, Path] = {}
    for kind in CHARTS:
        charts = sorted(results.glob(f"*-{kind}.svg"))
        if charts:
            found[kind] = charts[-1]
    return found


def bench_charts() -> str:
    """Markdown showing the newest charts, with the results file each was drawn from."""
    charts = newest_charts()
    if not charts:
        return "No charts yet: `make bench` (or `python -m bench.charts FILE.json`) draws them."
    lines = []
    for kind, path in charts.items():
        source = path.name.removesuffix(f"-{kind}.svg").removesuffix("-engines")
        lines += [
            f"### {CHARTS[kind]}",
            "",
            f"![{CHARTS[kind]}](charts/{path.name})",
            "",
            f"From `bench/results/{source}{'-engines' if kind == 'engines' else ''}.json`.",
            "",
        ]
    return "\n".join(lines)


def _include(match: re.Match[str]) -> str:
    text = (REPO / match.group(1)).read_text(encoding="utf-8")
    args = dict(ARG.findall(match.group(2)))
    if "from" in args:
        text = text[text.index("\n" + args["from"] + "\n") + 1 :]
    if "until" in args:
        text = text[: text.index("\n" + args["until"] + "\n") + 1]
    return text


def render(markdown: str) -> str:
    """A page's Markdown with its include and gen markers replaced."""
    markdown = INCLUDE.sub(_include, markdown)

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "bench-charts":
            return bench_charts()
        return gen_reference.GENERATORS[name]()

    return GEN.sub(generate, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return render(markdown)


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    """Add the generated OpenAPI document and the benchmark charts to the site."""
    schema = json.dumps(gen_reference.openapi_schema(), indent=2)
    files.append(File.generated(config, "reference/openapi.json", content=schema))
    for path in newest_charts().values():
        files.append(File.generated(config, f"charts/{path.name}", abs_src_path=str(path)))
    return files
