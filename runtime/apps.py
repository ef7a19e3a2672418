from __future__ import annotations

from django.apps import AppConfig

from audit import sealing


class RuntimeConfig(AppConfig):
    """What runs in a worker: the engine, the resume loop, the sweep, dispatch and reconciliation."""

    name = "runtime"

    def ready(self) -> None:
        from config import metrics
        from runtime import gauges

        # /metrics (config.metrics) sits below every app and imports none: its database gauges are
        # served from the readings this layer hands it, once the models are loaded.
        metrics.provide_readings(gauges.READINGS)
        # An agent run's sealed transcript, run states and conversation memory (runtime.sdk): key
        # rotation re-seals them too.
        sealing.register_json_column("agent turns", self.get_model("AgentTurn"), "response")
        sealing.register_json_column("agent snapshots", self.get_model("AgentSnapshot"), "body")
        sealing.register_json_column("agent sessions", self.get_model("AgentSessionItem"), "item")
