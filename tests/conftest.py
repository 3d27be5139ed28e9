"""Shared pytest fixtures: one warm JAX worker pool per test module.

Tests run on the CPU (TPU interpret mode) unless the caller chose a platform, as
``./dev test`` does. A module that uses ``worker_pool`` marks its tests with
``@pytest.mark.asyncio(loop_scope="module")`` (or sets it as ``pytestmark``): the pool lives on the
module's event loop and its workers import JAX once for the whole module.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Tests never read the user's config nor write sessions, lessons or compiles into the
# user's directories; subprocesses (the real `tilewright` in a pty, workers) inherit
# these too. One root for the run: the first pytest process (xdist's controller, or the
# only one) makes it, the processes it starts inherit it, and it goes when that one
# exits. The TPU compile cache under it starts empty, as on a fresh machine, and is
# shared by the run's processes; each process has its own data dir and config.
_OWNER = not os.path.isdir(os.environ.get("TILEWRIGHT_TEST_ROOT", ""))  # (a stale one: ours)
if _OWNER:
    os.environ["TILEWRIGHT_TEST_ROOT"] = tempfile.mkdtemp(prefix="tilewright-tests-")
    atexit.register(shutil.rmtree, os.environ["TILEWRIGHT_TEST_ROOT"], ignore_errors=True)
_ISOLATED = tempfile.mkdtemp(prefix="process-", dir=os.environ["TILEWRIGHT_TEST_ROOT"])
os.environ["TILEWRIGHT_DATA_DIR"] = os.path.join(_ISOLATED, "data")
os.environ["TILEWRIGHT_CONFIG"] = os.path.join(_ISOLATED, "config.toml")
os.environ.setdefault("TILEWRIGHT_CACHE_DIR",
                      os.path.join(os.environ["TILEWRIGHT_TEST_ROOT"], "cache"))

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker_pool() -> AsyncIterator[object]:
    """A started ``kernels.pool.workers.WorkerPool`` (size 1), shared by one test module."""
    from tilewright.kernels.pool.workers import WorkerPool

    async with WorkerPool(size=1) as pool:
        yield pool
