"""The read side: what the API and the console show, read once, as typed objects with a fixed query budget.

Both surfaces render from these (the API's JSON and the console's HTML are the same facts);
the layer sits above the runtime and workflows and below the surfaces (``[tool.importlinter]``).
"""

from __future__ import annotations
