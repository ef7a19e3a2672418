#!/usr/bin/env python3
"""Verify a signed audit export offline: ``python scripts/verify_export.py FILE --public-key KEYFILE``.

No Django, no database, no chain key: Python's standard library and ``cryptography``. The check is
``audit/export_check.py`` (that one file is all an auditor needs; it runs on its own as well). Exit 0
and ``ok: task …, N events`` for a valid file; 1 and the event (by version) that fails, or
``signature: …``; 2 when a file cannot be read. The public key: ``manage.py audit_anchor --public-key``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from audit.export_check import main  # noqa: E402  (after the path is set, as a script)

if __name__ == "__main__":
    sys.exit(main())
