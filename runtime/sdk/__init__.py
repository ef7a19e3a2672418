"""The OpenAI Agents SDK adapter: an SDK agent run as a durable step (``tasks.registry.AgentRun``).

The one module that imports the SDK (``agents``, the optional ``agents`` extra) is ``replay``;
``step`` is what the engine calls, ``snapshots`` keeps the SDK's paused run state as a checked
artifact, ``toolsets`` names a run's tool set and model without the SDK (for resume validation).
docs/building/agents-sdk.md ("Bring your own agent") says what becomes a step, an action, an approval.
"""
