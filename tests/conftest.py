"""Shared pytest fixtures: one warm JAX worker pool per test module.

Tests run on the CPU (TPU interpret mode) unless the caller chose a platform, as
``./dev test`` does. A module that uses ``worker_pool`` marks its tests with
``@pytest.mark.asyncio(loop_scope="module")`` (or sets it as ``pytestmark``): the pool lives on the
module's event loop and its workers import JAX once for the whole module.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Tests never read the user's config nor write sessions or lessons into the user's data
# dir; subprocesses (the real `tilewright` in a pty, workers) inherit these too.
_ISOLATED = tempfile.mkdtemp(prefix="tilewright-tests-")
os.environ["TILEWRIGHT_DATA_DIR"] = os.path.join(_ISOLATED, "data")
os.environ["TILEWRIGHT_CONFIG"] = os.path.join(_ISOLATED, "config.toml")

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker_pool() -> AsyncIterator[object]:
    """A started ``kernels.pool.workers.WorkerPool`` (size 1), shared by one test module."""
    from tilewright.kernels.pool.workers import WorkerPool

    async with WorkerPool(size=1) as pool:
        yield pool
