"""Where the source hands a task a reason code, found with `ast` (tests/docs/test_reason_registry.py).

A *carrier* is a call that takes a reason code: any call's `reason_code=` keyword, the `reason` of an
outcome a call writes (`changes={"outcome": {"reason": ...}}`), and the functions
and exceptions below at the argument that becomes one (`quarantine(progress, code, ...)`,
`Fail(name, reason=...)`, `raise AgentFailed(code, ...)` …). At each carrier the argument is resolved
as far as the source allows: a string literal; a module-level string constant (by name, or as
`module.NAME` / `Class.NAME`); a `Trigger` or `CancelScope` member; either side of `a if c else b` and
`a or b`; a value of a module-level dict (`RUN_REFUSALS[...]`); a local variable through its
assignments in the enclosing function; an f-string whose parts all resolve. A parameter of a carrier
function is forwarded (its callers are carriers themselves). Whatever is left is a *dynamic* site,
reported as (path, expression) for the test to match against the ones the registry explains.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The packages whose code moves tasks (the console only shows codes; the API refuses with its own).
PACKAGES = ("runtime", "tasks", "approvals", "protection", "ledger", "workflows", "reads", "demo")

# Carrier name -> (positional index, keyword) of its reason-code argument.
CARRIERS: dict[str, tuple[int | None, str]] = {
    "quarantine": (1, "code"),
    "retry_later": (None, "code"),
    "_not_as_intended": (None, "code"),
    "_told": (4, "code"),
    "_refused": (2, "code"),
    "_refused_call": (4, "code"),
    "_ask_again": (6, "code"),
    "_move": (2, "trigger"),  # runtime.sweep: the trigger is the reason code
    "Fail": (None, "reason"),
    "AgentFailed": (0, "code"),
    "SnapshotRefused": (0, "code"),
    "CheckpointUnreadable": (0, "reason"),
    "EffectMismatch": (None, "code"),
}
# Carriers whose name other modules use for something else: only in this module.
ONLY_IN = {"_move": "runtime/sweep.py"}


@dataclass(frozen=True)
class Site:
    path: str  # relative to the repository
    line: int
    expression: str  # the argument as written
    codes: tuple[str, ...]  # what it resolves to; empty for a dynamic site
    dynamic: bool


def _enums() -> dict[str, dict[str, str]]:
    from tasks.models import CancelScope
    from tasks.states import Trigger

    return {
        "Trigger": {member.name: str(member.value) for member in Trigger},
        "CancelScope": {member.name: str(member.value) for member in CancelScope},
    }


class _Module:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None


def _module_constants(modules: list[_Module]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Module- and class-level `NAME = "text"` constants and `NAME = {...: "text"}` dicts, by name and
    by `owner.NAME` (the owner a module's last name, or a class's)."""
    strings: dict[str, set[str]] = {}
    dicts: dict[str, set[str]] = {}
    for module in modules:
        bodies = [(module.path.stem, module.tree.body)]
        bodies += [(n.name, n.body) for n in module.tree.body if isinstance(n, ast.ClassDef)]
        for owner, body in bodies:
            for node in body:
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                    continue
                target = node.targets[0]
                if not (isinstance(target, ast.Name) and target.id.isupper()):
                    continue
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    strings.setdefault(target.id, set()).add(node.value.value)
                    strings.setdefault(f"{owner}.{target.id}", set()).add(node.value.value)
                elif isinstance(node.value, ast.Dict) and all(
                    isinstance(v, ast.Constant) and isinstance(v.value, str) for v in node.value.values
                ):
                    dicts.setdefault(target.id, set()).update(v.value for v in node.value.values)  # type: ignore[union-attr]
    return strings, dicts


class _Resolver:
    def __init__(self, modules: list[_Module]) -> None:
        self.strings, self.dicts = _module_constants(modules)
        self.enums = _enums()

    def resolve(self, module: _Module, node: ast.expr, depth: int = 0) -> set[str] | None:
        """The codes ``node`` can be, or None when the source does not say."""
        if depth > 6:
            return None
        match node:
            case ast.Attribute(attr="reason_code"):
                return set()  # copied from a decision, whose own code was scanned where it was made
            case ast.Constant(value=str() as text):
                return {text} if text else set()
            case ast.Attribute(value=ast.Name(id=owner), attr=name) if owner in self.enums:
                value = self.enums[owner].get(name)
                return {value} if value is not None else None
            case ast.Attribute(value=ast.Name(id=owner), attr=name) if f"{owner}.{name}" in self.strings:
                return set(self.strings[f"{owner}.{name}"])
            case ast.Attribute(attr=name) if name.isupper() and len(self.strings.get(name, ())) == 1:
                return set(self.strings[name])
            case ast.Name(id=name) if f"{module.path.stem}.{name}" in self.strings:
                return set(self.strings[f"{module.path.stem}.{name}"])
            case ast.Name(id=name) if name.isupper() and len(self.strings.get(name, ())) == 1:
                return set(self.strings[name])
            case ast.IfExp(body=body, orelse=orelse):
                return self._all(module, [body, orelse], depth)
            case ast.BoolOp(values=values):
                return self._all(module, values, depth)
            case ast.Subscript(value=ast.Name(id=name)) if name in self.dicts:
                return set(self.dicts[name])
            case ast.JoinedStr(values=parts):
                text = ""
                for part in parts:
                    if isinstance(part, ast.Constant):
                        text += str(part.value)
                        continue
                    inner = self.resolve(module, part.value, depth + 1)  # type: ignore[attr-defined]
                    if inner is None or len(inner) != 1:
                        return None
                    text += next(iter(inner))
                return {text}
            case ast.Name(id=name):
                return self._local(module, node, name, depth)
        return None

    def _all(self, module: _Module, nodes: list[ast.expr], depth: int) -> set[str] | None:
        found: set[str] = set()
        for each in nodes:
            inner = self.resolve(module, each, depth + 1)
            if inner is None:
                return None
            found |= inner
        return found

    def _local(self, module: _Module, node: ast.Name, name: str, depth: int) -> set[str] | None:
        function = module.function_of(node)
        if function is None:
            return None
        values = [
            each.value
            for each in ast.walk(function)
            if isinstance(each, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in each.targets)
        ]
        return self._all(module, values, depth) if values else None


def _argument(node: ast.Call, position: int | None, keyword: str) -> ast.expr | None:
    for each in node.keywords:
        if each.arg == keyword:
            return each.value
    if position is not None and len(node.args) > position:
        argument = node.args[position]
        return None if isinstance(argument, ast.Starred) else argument
    return None


def _callee(node: ast.Call) -> str:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return ""


def _forwarded(module: _Module, node: ast.expr) -> bool:
    """A parameter of a carrier function, or one named `reason_code` (its callers are scanned)."""
    function = module.function_of(node)
    if not isinstance(node, ast.Name) or function is None:
        return False
    if node.id not in {a.arg for a in function.args.args + function.args.kwonlyargs}:
        return False
    return function.name in CARRIERS or node.id == "reason_code"


def _outcome_reasons(node: ast.Call) -> list[ast.expr]:
    """The `reason` of an outcome a call writes: `outcome={"reason": ...}` or
    `changes={"outcome": {"reason": ...}}` (a failed or expired task's outcome)."""
    outcomes = [k.value for k in node.keywords if k.arg == "outcome"]
    for keyword in node.keywords:
        if isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "outcome":
                    outcomes.append(value)
    found = []
    for outcome in outcomes:
        if isinstance(outcome, ast.Dict):
            for key, value in zip(outcome.keys, outcome.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "reason":
                    found.append(value)
    return found


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[_Module]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" not in path.parts and "tests" not in path.parts:
                found.append(_Module(path))
    return found


def sites(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Iterator[Site]:
    scanned = modules(root, packages)
    resolver = _Resolver(scanned)
    for module in scanned:
        relative = str(module.path.relative_to(root))
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Call):
                continue
            arguments = [k.value for k in node.keywords if k.arg == "reason_code"]
            callee = _callee(node)
            carrier = CARRIERS.get(callee) if ONLY_IN.get(callee, relative) == relative else None
            if carrier is not None and (found := _argument(node, *carrier)) is not None:
                arguments.append(found)
            arguments += _outcome_reasons(node)
            for argument in arguments:
                if _forwarded(module, argument):
                    continue
                codes = resolver.resolve(module, argument)
                yield Site(
                    relative,
                    argument.lineno,
                    ast.unparse(argument),
                    tuple(sorted(codes or ())),
                    codes is None,
                )
