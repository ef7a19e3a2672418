"""The docs site's generated reference, read from the code at build time so it cannot drift.

`mkdocs.yml` names this module as a hook: a page holding a marker such as `<!-- reference:states -->`
gets the markdown below in its place. Each generator reads its one source of truth:

- states and transitions: `tasks.states` (the ONE transition table), drawn as a Mermaid diagram too;
- reason codes: the registry `tasks.reasons` (which tests/docs/test_reason_registry.py checks against
  every place the code gives one), joined with the console's per-code guidance on a quarantined task
  (`console.quarantine.BEFORE_RELEASE`);
- settings: every environment variable `config/settings.py` reads (name and default, from its source
  text) with its meaning from `scripts/settings_meanings.toml`;
- management commands: each project command's own `--help`;
- the REST API: the pinned OpenAPI document, `tests/fixtures/openapi.json`.

`tests/docs/test_reference.py` checks each against the code in both directions.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS_SOURCE = ROOT / "config" / "settings.py"
MEANINGS = ROOT / "scripts" / "settings_meanings.toml"
OPENAPI = ROOT / "tests" / "fixtures" / "openapi.json"
# The project's own apps: their management commands are documented (Django's and libraries' are not).
PROJECT_APPS = (
    "tenancy",
    "audit",
    "ledger",
    "tasks",
    "approvals",
    "protection",
    "reads",
    "runtime",
    "workflows",
    "interop",
    "api",
    "console",
    "a2a_api",
    "demo",
    "config",
)
MARKER = re.compile(r"<!--\s*reference:([a-z_-]+)\s*-->")


def django_ready() -> None:
    """Load the apps with the development profile (no secrets needed; nothing touches a database)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "1")
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- states and transitions ---------------------------------------------------------------------


def state_names() -> list[str]:
    django_ready()
    from tasks.states import State

    return [str(state.value) for state in State]


def states_markdown() -> str:
    django_ready()
    from tasks import states

    def kind(state: Any) -> str:
        if state in states.TERMINAL:
            return "terminal"
        if state in states.WAITING:
            return "waiting (has a `wait_deadline`)"
        if state in states.RUNNABLE:
            return "runnable (a worker may lease it)"
        return "held"

    lines = ["| state | kind | leaves by |", "|---|---|---|"]
    for state in states.State:
        triggers = sorted({str(edge.trigger.value) for edge in states.edges_from(state)})
        lines.append(f"| `{state.value}` | {kind(state)} | {', '.join(f'`{t}`' for t in triggers)} |")
    lines += ["", "### The transition diagram", "", "```mermaid", "stateDiagram-v2"]
    lines.append(f"    [*] --> {states.State.READY.value}: start")
    pairs: dict[tuple[str, str], list[str]] = {}
    for edge in states.TRANSITIONS:
        if edge.source == edge.target:
            continue  # self-loops (escalate, failover, late effect found, fork) are in the table below
        pairs.setdefault((edge.source.value, edge.target.value), []).append(edge.trigger.value)
    for (source, target), triggers in pairs.items():
        lines.append(f"    {source} --> {target}: {', '.join(dict.fromkeys(triggers))}")
    for state in sorted(states.TERMINAL):
        lines.append(f"    {state.value} --> [*]")
    lines += ["```", "", "### The transition table", ""]
    lines += ["| from | to | trigger | who may pull it |", "|---|---|---|---|"]
    for edge in states.TRANSITIONS:
        by = ", ".join(sorted(kind.value for kind in edge.by))
        lines.append(f"| `{edge.source.value}` | `{edge.target.value}` | `{edge.trigger.value}` | {by} |")
    return "\n".join(lines) + "\n"


# --- reason codes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reason:
    code: str
    where: str
    meaning: str
    before_release: str  # the console's guidance on a quarantined task with this code ("" if none)
    built: str  # where a code built at run time is built ("" for a code the source spells)


# The order the reference groups codes in: where a person meets them, the held ones first.
WHERE_ORDER = ("quarantined", "failed", "waiting_retry", "expired", "canceled", "audit event", "alert")


def reason_codes() -> list[Reason]:
    """Every code of the registry (`tasks.reasons`), each with the console's release guidance."""
    django_ready()
    from console.quarantine import BEFORE_RELEASE
    from tasks.reasons import REASONS

    rows = [
        Reason(
            reason.code,
            ", ".join(reason.where),
            reason.meaning,
            BEFORE_RELEASE.get(reason.code, ""),
            reason.dynamic,
        )
        for reason in REASONS
    ]
    first = {r.code: WHERE_ORDER.index(r.where[0]) for r in REASONS}
    return sorted(rows, key=lambda row: (first[row.code], row.code))


def reasons_markdown() -> str:
    lines = ["| code | where you meet it | what it means | what to do |", "|---|---|---|---|"]
    for reason in reason_codes():
        meaning = reason.meaning + (f" *Built at run time: {reason.built}.*" if reason.built else "")
        lines.append(
            f"| `{reason.code}` | {reason.where} | {_cell(meaning)} | {_cell(reason.before_release)} |"
        )
    return "\n".join(lines) + "\n"


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # the default as the source spells it
    meaning: str


def _env_reads(tree: ast.AST) -> Iterator[tuple[str, str]]:
    """(variable, default source) for each `env.<kind>("NAME", default=...)` in the settings module, and
    the `CONNECTOR_<NAME>_...` families read through `config.external`."""
    source = SETTINGS_SOURCE.read_text()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "env" and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                yield name.value, (ast.get_source_segment(source, default) or "") if default else ""
        if isinstance(owner, ast.Name) and owner.id == "external":
            if node.func.attr == "connector_values" and len(node.args) > 1:
                suffix = node.args[1]
                if isinstance(suffix, ast.Constant) and isinstance(suffix.value, str):
                    yield f"CONNECTOR_<NAME>{suffix.value}", ""
            elif node.func.attr == "connector_headers":
                yield "CONNECTOR_<NAME>_HEADERS", ""


def settings_in_code() -> dict[str, str]:
    """Every variable the settings module reads, with its default as written there."""
    tree = ast.parse(SETTINGS_SOURCE.read_text())
    return dict(_env_reads(tree))


def settings_meanings() -> dict[str, dict[str, str]]:
    with MEANINGS.open("rb") as handle:
        return {name: dict(entry) for name, entry in tomllib.load(handle).items()}


def _says_the_same(note: str, source: str) -> bool:
    """Whether a note only repeats the code's literal default (`"dev"` and `dev`, `5.0` and `5`)."""
    spelled = {"True": "1", "False": "0"}.get(source, source).strip('"')
    spelled = spelled[:-2] if spelled.endswith(".0") else spelled
    return note.strip("`") == spelled


def settings() -> list[Setting]:
    code = settings_in_code()
    rows = []
    for name, entry in settings_meanings().items():
        parts = [f"`{code[name]}`"] if code.get(name) else []
        note = entry.get("default_note", "")
        if note and not _says_the_same(note, code.get(name, "")):
            parts.append(note)
        rows.append(Setting(name, " — ".join(parts) or "unset", entry["meaning"]))
    return rows


def settings_markdown() -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for setting in settings():
        lines.append(f"| `{setting.name}` | {_cell(setting.default)} | {_cell(setting.meaning)} |")
    return "\n".join(lines) + "\n"


# --- management commands ---------------------------------------------------------------------


def command_names() -> dict[str, str]:
    """Command name -> the project app that ships it."""
    django_ready()
    from django.core.management import get_commands

    return {
        name: app
        for name, app in sorted(get_commands().items())
        if app.split(".")[0] in PROJECT_APPS or app.startswith("demo")
    }


def command_help(name: str, app: str) -> str:
    from django.core.management import load_command_class

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the page must not depend on one
    command = load_command_class(app, name)
    return command.create_parser("manage.py", name).format_help()


def commands_markdown() -> str:
    parts = []
    for name, app in command_names().items():
        usage = command_help(name, app).rstrip()
        parts += [f"## `{name}`", "", f"*From `{app}`.*", "", "```text", usage, "```", ""]
    return "\n".join(parts)


# --- the REST API ------------------------------------------------------------------------------


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items', {}))}"
    return f"`{schema.get('type', 'object')}`"


def openapi_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(OPENAPI.read_text())
    return document


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in openapi_document()["paths"].items():
        for method, operation in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield path, method, operation


def api_markdown() -> str:
    document = openapi_document()
    lines = [f"*{document['info'].get('title', '')} {document['info'].get('version', '')}*", ""]
    for path, method, op in operations():
        lines += [f"### `{method.upper()} {path}`", ""]
        if op.get("description"):
            lines += [op["description"].strip(), ""]
        params = op.get("parameters", [])
        if params:
            lines += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
            for param in params:
                schema = param.get("schema", {})
                kind = _schema_name(schema)
                if schema.get("enum"):
                    kind += ": " + ", ".join(f"`{value}`" for value in schema["enum"])
                meaning = _cell(param.get("description", ""))
                lines.append(f"| `{param['name']}` | {param['in']} | {_cell(kind)} | {meaning} |")
            lines.append("")
        body = op.get("requestBody", {}).get("content", {})
        if body:
            media, content = next(iter(body.items()))
            lines += [f"Body ({media}): {_schema_name(content.get('schema', {}))}", ""]
        lines += ["| answer | meaning |", "|---|---|"]
        for status, answer in op.get("responses", {}).items():
            content = answer.get("content", {})
            shape = ""
            if content:
                shape = _schema_name(next(iter(content.values())).get("schema", {}))
            text = " ".join(part for part in (answer.get("description", ""), shape) if part)
            lines.append(f"| {status} | {_cell(text)} |")
        lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        lines += [f"### `{name}`", ""]
        if schema.get("description"):
            lines += [schema["description"].strip(), ""]
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        if props:
            lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
            for field, spec in props.items():
                kind = _schema_name(spec) if ("$ref" in spec or "type" in spec) else "`object`"
                if spec.get("enum"):
                    kind += ": " + ", ".join(f"`{value}`" for value in spec["enum"])
                flags = " (read-only)" if spec.get("readOnly") else ""
                lines.append(
                    f"| `{field}` | {_cell(kind)}{flags} | {'yes' if field in required else 'no'} "
                    f"| {_cell(spec.get('description', ''))} |"
                )
            lines.append("")
        elif schema.get("enum"):
            lines += [", ".join(f"`{value}`" for value in schema["enum"]), ""]
    return "\n".join(lines)


GENERATORS: dict[str, Callable[[], str]] = {
    "states": states_markdown,
    "reasons": reasons_markdown,
    "settings": settings_markdown,
    "commands": commands_markdown,
    "api": api_markdown,
}


def expand(markdown: str) -> str:
    """The page with each reference marker replaced by its generated markdown."""
    return MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)


# --- the MkDocs hook ---------------------------------------------------------------------------


def on_page_markdown(markdown: str, **_: object) -> str:
    return expand(markdown)
