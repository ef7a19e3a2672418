"""The test run's environment, in place before Django reads its settings.

``config.settings`` is safe by default: DEBUG off, no start without a SECRET_KEY, no sandbox.
The suite is a development run with the sandbox on, and says so here, once: pytest loads this
module as a plugin (``-p tests.environment`` in pyproject.toml) before pytest-django imports the
settings, and every process a test starts (servers, workers, ``manage.py``, the benches, the soak)
inherits ``os.environ``, so all of them run with the same environment unless a test says otherwise.
The values are fixed rather than defaults: the tests are written for this profile, whatever the
shell that runs them exports.
"""

from __future__ import annotations

import os

TEST_ENVIRONMENT = {
    "DEBUG": "1",
    "SECRET_KEY": "test-only-insecure-key",
    "SANDBOX_ENABLED": "1",
    "SANDBOX_TOKEN": "test-only-sandbox-token",
}

os.environ.update(TEST_ENVIRONMENT)
