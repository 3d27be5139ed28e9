"""The environment a worker process starts with: secrets removed, logging silenced.

Imported by the app side (``kernels.workers``) to build the child's environment and by
the worker itself (``kernels.harness.worker``) as a second line of defence when it is
started by hand. No JAX here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# A variable whose name contains one of these (any case) never reaches a worker.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
SECRET_PREFIXES = ("ANTHROPIC_",)

# Set before JAX is imported: keeps XLA/TF/libtpu/gRPC chatter out of the captured
# stderr (it is captured anyway, this keeps it short). User values win.
QUIET = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_CPP_MAX_VLOG_LEVEL": "0",
    "GLOG_minloglevel": "3",
    "TPU_STDERR_LOG_LEVEL": "3",
    "TPU_MIN_LOG_LEVEL": "3",
    "GRPC_VERBOSITY": "ERROR",
    "ABSL_MIN_LOG_LEVEL": "3",
    "PYTHONUNBUFFERED": "1",  # candidate prints land in the capture before a reply
    "PYTHONDONTWRITEBYTECODE": "1",
}


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS) or upper.startswith(SECRET_PREFIXES)


def worker_environment(base: Mapping[str, str] | None = None,
                       overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ``base`` (default os.environ) minus secrets, plus quiet
    logging defaults, plus ``overrides`` (secret-named overrides are dropped too).

    JAX_PLATFORMS is passed through untouched: on a TPU host the worker must use the TPU.
    """
    source = dict(os.environ if base is None else base)
    env = {k: v for k, v in source.items() if not is_secret(k)}
    for key, value in QUIET.items():
        env.setdefault(key, value)
    for key, value in (overrides or {}).items():
        if not is_secret(key):
            env[key] = value
    # The worker runs ``python -m kernels.harness.worker``: make the package importable
    # even when tilewright is not installed (running from a checkout).
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


def scrub_current_process() -> None:
    """Remove secrets from this process's own environment (worker side)."""
    for key in [k for k in os.environ if is_secret(k)]:
        del os.environ[key]
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
