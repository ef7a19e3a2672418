import importlib
import pkgutil

from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"

    def ready(self) -> None:
        # Every other module of the package is a task type that registers itself on import.
        for module in pkgutil.iter_modules(importlib.import_module(self.name).__path__):
            if module.name != "apps":
                importlib.import_module(f"{self.name}.{module.name}")
