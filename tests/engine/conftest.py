"""Fixtures of the engine tests (tiny random checkpoints: engine_support)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The engine tests' models are tiny: a second intra-op thread buys nothing and, on a shared 2-core
    machine, spin-waiting threads multiply wall time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
