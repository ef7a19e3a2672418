"""The code's messages and comments cite docs pages that exist, never the README's old sections (issue 28)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("a2a_api", "api", "approvals", "audit", "config", "console", "demo", "deploy", "interop",
            "ledger", "protection", "reads", "runtime", "tasks", "tenancy", "workflows")  # fmt: skip
CITED = re.compile(r"docs/[\w/.-]+\.md(?:#[\w-]+)?")
OLD_SECTION = re.compile(r"README[,']?s?\W{1,3}[\"'][A-Z]")  # (README, "Retention"), README "Database roles"


def sources() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def test_no_code_cites_a_readme_section():
    found = [
        f"{p.relative_to(ROOT)}: {m.group()}" for p in sources() for m in OLD_SECTION.finditer(p.read_text())
    ]
    assert found == []


def test_every_docs_page_the_code_cites_exists_with_its_heading():
    cited = {m.group() for p in sources() for m in CITED.finditer(p.read_text())}
    assert (
        "docs/operating/retention.md" in cited and "docs/operating/tamper-evidence.md#database-roles" in cited
    )
    for citation in sorted(cited):
        page, _, anchor = citation.partition("#")
        assert (ROOT / page).is_file(), citation
        if anchor:
            headings = {
                re.sub(r"[^\w\s-]", "", line.lstrip("#").strip()).lower().replace(" ", "-")
                for line in (ROOT / page).read_text().splitlines()
                if line.startswith("#")
            }
            assert anchor in headings, citation
