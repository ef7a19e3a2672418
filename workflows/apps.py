import importlib
import pkgutil

from django.apps import AppConfig

from tasks import registry, sealing


class WorkflowsConfig(AppConfig):
    name = "workflows"

    def ready(self) -> None:
        # Every other module of the package is a task type that registers itself on import.
        for module in pkgutil.iter_modules(importlib.import_module(self.name).__path__):
            if module.name != "apps":
                importlib.import_module(f"{self.name}.{module.name}")
        # Refuse to start with malformed keys, or with none while some type has fields to seal.
        sealing.check_configuration([name for name in registry.names() if registry.sensitive_fields(name)])
