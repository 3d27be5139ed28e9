"""Environments for the CLI as a stranger runs it: nothing of ours but ``PATH``, ``HOME``
at the checkout (no config of the user's to find), and the test run's own tilewright
directories (conftest), so the run's caches, data and config never land in the checkout's
``.cache``."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_DIRS = ("TILEWRIGHT_CACHE_DIR", "TILEWRIGHT_DATA_DIR", "TILEWRIGHT_CONFIG")


def bare(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(ROOT),
            **{k: os.environ[k] for k in RUN_DIRS if k in os.environ}, **extra}
