from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from django.apps import AppConfig

from audit import sealing
from audit.redaction import register_sensitive_fields
from tasks import registry

# Field names kept out of the log and audit redaction however a task type marks them. Redaction masks
# the value after ``<name>=`` or ``<name>:`` in every log line, span attribute and audit reason, and
# these words are also the system's own keys there: ``reason=retries_exhausted``, ``"to": "ready"``,
# ``status: 503``. Registering them would hide what operators need to read. The fields themselves are
# still sealed at rest and masked on every page; only free text keyed by these words is left as it is.
ORDINARY_WORDS = frozenset(
    {
        "action", "answer", "comment", "detail", "from", "id", "key", "kind", "message", "name", "note",
        "reason", "record", "state", "status", "step", "text", "to", "type", "value",
    }
)  # fmt: skip


# Modules whose task types are SDK agents (runtime.sdk): registered only when the SDK is installed.
NEEDS_AGENTS_SDK = frozenset({"support_agent"})


def redaction_names() -> frozenset[str]:
    """Every registered type's sensitive facts and sensitive effect keys, bar ``ORDINARY_WORDS``."""
    names: set[str] = set()
    for type_name in registry.names():
        kind = registry.get(type_name)
        names |= kind.sensitive
        names |= {key for step in kind.steps if isinstance(step, registry.Dispatch) for key in step.sensitive}
        names |= {
            key
            for run in kind.agent_runs
            for tool in run.tools
            if isinstance(tool, registry.AgentEffect)
            for key in tool.sensitive
        }
    return frozenset(names - ORDINARY_WORDS)


class WorkflowsConfig(AppConfig):
    name = "workflows"

    def ready(self) -> None:
        # Every other module of the package is a task type that registers itself on import (its
        # subpackages are not: ``workflows.sdk`` holds the SDK agents, imported by their first run).
        # The types written with the Agents SDK only where it is installed (the ``agents`` extra).
        sdk = importlib.util.find_spec("agents") is not None
        for module in pkgutil.iter_modules(importlib.import_module(self.name).__path__):
            if module.ispkg or module.name == "apps":
                continue
            if sdk or module.name not in NEEDS_AGENTS_SDK:
                importlib.import_module(f"{self.name}.{module.name}")
        # Refuse to start with malformed keys, or with none while some type has fields to seal.
        sealing.check_configuration([name for name in registry.names() if registry.sensitive_fields(name)])
        # Log lines, span attributes and audit reasons mask these fields' values too (the rule for
        # which names: ORDINARY_WORDS above).
        register_sensitive_fields(redaction_names())
