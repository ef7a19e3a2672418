"""The docs' generated reference against the code, both ways: every state, transition, reason code,
setting, management command and API operation the code has appears in the reference, and nothing the
reference documents is missing from the code (scripts/docs_reference.py renders it at build time)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts import docs_reference as ref

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def first_column(markdown: str) -> list[str]:
    """The backticked names in the first column of a markdown table."""
    return re.findall(r"^\| `([^`]+)` \|", markdown, re.M)


def test_every_state_and_only_states_are_documented():
    from tasks.states import State

    page = ref.states_markdown()
    table = page[: page.index("### The transition diagram")]
    assert first_column(table) == [state.value for state in State]
    diagram = page[page.index("```mermaid") : page.index("### The transition table")]
    for state in State:
        assert re.search(rf"\b{state.value}\b", diagram), state


def test_every_transition_is_in_the_table_and_the_diagram():
    from tasks.states import TRANSITIONS

    page = ref.states_markdown()
    rows = set(re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", page, re.M))
    assert rows == {(e.source.value, e.target.value, e.trigger.value) for e in TRANSITIONS}
    arrows = {
        (source, target): set(triggers.split(", "))
        for source, target, triggers in re.findall(r"^    (\w+) --> (\w+): (.+)$", page, re.M)
    }
    for edge in TRANSITIONS:
        if edge.source != edge.target:
            assert edge.trigger.value in arrows[(edge.source.value, edge.target.value)], edge


def test_every_reason_code_and_only_those_are_documented():
    """The registry's codes, each once (tests/docs/test_reason_registry.py holds it to the code)."""
    from console.quarantine import BEFORE_RELEASE
    from tasks.reasons import REASONS

    in_registry = {reason.code for reason in REASONS}
    assert {"refund_needs_manual_review", "payment_rejected_by_approver", "cancel:children"} <= in_registry
    page = ref.reasons_markdown()
    documented = first_column(page)
    assert len(documented) == len(set(documented))
    assert set(documented) == in_registry
    for reason in REASONS:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{reason.code}` |"))
        assert ref._cell(reason.meaning) in row, reason.code
        if reason.code in BEFORE_RELEASE:  # the console's own words, not a second copy
            assert ref._cell(BEFORE_RELEASE[reason.code]) in row, reason.code


def test_every_setting_the_code_reads_has_a_meaning_and_every_meaning_a_setting():
    in_code = ref.settings_in_code()
    meanings = ref.settings_meanings()
    read_here = {name for name, entry in meanings.items() if "read_in" not in entry}
    assert set(in_code) - read_here == set(), "settings read by config/settings.py with no meaning"
    assert read_here - set(in_code) == set(), "meanings of settings config/settings.py does not read"
    for name, entry in meanings.items():
        assert entry["meaning"].strip(), name
        if "read_in" in entry:
            assert name in (ROOT / entry["read_in"]).read_text(), (name, entry["read_in"])


def test_the_settings_page_shows_each_default_as_the_code_spells_it():
    page = ref.settings_markdown()
    assert first_column(page) == list(ref.settings_meanings())
    for name, default in ref.settings_in_code().items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        if default:
            assert f"`{ref._cell(default)}`" in row, name


def test_every_project_command_and_only_those_are_documented():
    page = ref.commands_markdown()
    documented = re.findall(r"^## `(\w+)`$", page, re.M)
    names = ref.command_names()
    assert documented == sorted(names)
    assert {"verify_audit", "seed_demo", "run_worker", "failover", "drf_create_token"} <= set(names)
    for name in names:
        assert f"usage: manage.py {name}" in page, name


def test_every_api_operation_and_only_those_are_documented():
    page = ref.api_markdown()
    documented = set(re.findall(r"^### `([A-Z]+) (/\S*)`$", page, re.M))
    in_schema = {(method.upper(), path) for path, method, _ in ref.operations()}
    assert documented == in_schema
    assert ("POST", "/api/tasks/") in documented


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_marker_names_a_generator_and_nothing_points_outside_the_repository(page):
    text = page.read_text()
    for name in ref.MARKER.findall(text):
        assert name in ref.GENERATORS, name
    for target in re.findall(r"\]\(([^)#]+)", text):
        assert not target.startswith(("http:", "https:", "/")), target
        assert (page.parent / target).resolve().is_relative_to(DOCS), target
    assert "shared/DESIGN" not in text


def test_each_generated_reference_is_on_a_page():
    markers = {name for page in DOCS.rglob("*.md") for name in ref.MARKER.findall(page.read_text())}
    assert markers == set(ref.GENERATORS)


def test_the_readme_is_one_screen_whose_links_stay_in_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 60
    assert "make demo " in readme and "make test " in readme
    targets = re.findall(r"\]\(([^)#]+)", readme)
    assert targets
    for target in targets:
        assert not target.startswith(("http:", "https:", "/", "..")), target
        assert (ROOT / target).is_file(), target
    assert "shared/DESIGN" not in readme
