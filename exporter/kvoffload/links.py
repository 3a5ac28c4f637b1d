"""Where the documentation lives, as absolute URLs.

The wheel carries no docs/, so everything shown to a user outside this repository — the CLI's
`--help`, the generated rules' `runbook_url`, the dashboards' panel descriptions — links here.
pyproject.toml's `[project.urls]` holds the same addresses (tests/test_packaging.py checks that
they agree).
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
    """A command's `--help` epilog listing these pages' URLs, one a line and never re-wrapped
    (click would cut a URL longer than the help column in two)."""
    return "\b\nDocs:\n" + "\n".join(f"  {doc(page)}" for page in pages)
