"""Reads a worker repeats on every step, compiled once per connection.

Building a queryset's SQL costs the worker more CPU than PostgreSQL spends running it: an agent step's
read of its run's turns and ledger actions (``runtime.sdk.step``) spent most of its time in the ORM's
compiler. ``rows`` compiles a queryset once per thread's connection, with stand-in values for what
changes between calls (a task id, a step name), and afterwards only swaps the values in. Rows come
back as the queryset would give them: every column through its field's converters.

The queryset stays the one description of the read, so the statement cannot drift from the models.
The compiling is ``tasks.hotpath``'s, which reads a transition's task row the same way; it is named
here as the runtime's reads use it.
"""

from __future__ import annotations

from tasks.hotpath import rows

__all__ = ["rows"]
