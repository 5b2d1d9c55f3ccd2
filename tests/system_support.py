"""System programs the end-to-end tests drive (Debian's chromium, prometheus).

Locally a missing program skips its tests; CI sets PCGTTS_REQUIRE_SYSTEM_TESTS=1 (after
`make system-deps` installed them), and there a missing program fails the test instead.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require_program(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (make system-deps)"
        if os.environ.get("PCGTTS_REQUIRE_SYSTEM_TESTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
