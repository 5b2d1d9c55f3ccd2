"""System programs the end-to-end tests drive (Debian's chromium, prometheus) and optional packages
(xcodec2, vLLM).

Locally a missing program or package skips its tests; CI sets PCGTTS_REQUIRE_SYSTEM_TESTS=1 (after
`make system-deps` and `make test` installed them), and there a missing one fails the test instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def missing(message: str) -> None:
    """Skip (locally) or fail (CI) a test whose program or package is not installed."""
    if os.environ.get("PCGTTS_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def require_program(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed (make system-deps)")
    return path


def require_package(module: str, what: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        missing(f"{what} is not installed ({install})")
