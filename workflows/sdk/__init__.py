"""Agents written with the OpenAI Agents SDK, imported only by a run that needs one (not task types:
``workflows.apps`` does not import this package)."""
