"""Where the documentation lives, as absolute URLs.

Why: the wheel carries no docs/, so `--help`, runbook URLs and dashboard panels link here.
pyproject.toml's `[project.urls]` must agree (tests/test_packaging.py).
"""

from __future__ import annotations

PROJECT_URL = "https://github.com/kvoffload/kvoffload"
BRANCH = "main"
# pyproject.toml's Documentation URL: the docs/ folder.
DOCS_URL = f"{PROJECT_URL}/tree/{BRANCH}/docs"
ISSUES_URL = f"{PROJECT_URL}/issues"


def doc(page: str, anchor: str = "") -> str:
    """The URL of a page of docs/ (`doc("runbooks.md", "kvoffloadbuffertoosmall")`)."""
    url = f"{PROJECT_URL}/blob/{BRANCH}/docs/{page}"
    return f"{url}#{anchor}" if anchor else url


def docs_epilog(*pages: str) -> str:
    """A command's `--help` epilog of these pages' URLs, one a line. Why: never re-wrapped, since
    click would cut a long URL."""
    return "\b\nDocs:\n" + "\n".join(f"  {doc(page)}" for page in pages)
