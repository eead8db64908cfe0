"""README.md is the front page: short, the two commands, three recipes, links into the docs.

What the README used to check (the server's flag table generated from the settings, every
PPO config key documented) is checked on the docs site now: tests/e2e/test_docs.py.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 200


def test_the_two_commands_are_shown() -> None:
    assert "make demo" in README and "make test" in README


def test_the_three_recipes_are_there() -> None:
    headings = re.findall(r"^## (.+)$", README, re.MULTILINE)
    recipes = [h for h in headings if h.startswith("Recipe:")]
    assert len(recipes) == 3, headings
    assert "reward-server --model" in README
    assert "ppo-client train --config" in README
    assert "--api-keys" in README


def test_every_relative_link_points_at_a_file_of_the_repository() -> None:
    """Relative links work on GitHub as they do in a checkout: each names a file that exists."""
    targets = [t for t in LINK.findall(README) if "://" not in t and not t.startswith("#")]
    docs = [t for t in targets if t.startswith("docs/")]
    assert len(docs) >= 20, "the README links into the docs site"
    missing = [t for t in targets if not (REPO / t.split("#")[0]).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"
