"""The app's side of judging: worker processes on this machine or a Ray cluster.

- ``workers``: ``WorkerPool``, the worker processes (``process``: one of them and its
  private channel, framed by ``protocol``; ``env``: the environment it starts with,
  secrets removed).
  A pool is itself a judge (``kernels.judge.protocol``): a session judges through one.
- ``local``: ``LocalExecutor``, the CLIs' judge on this machine: one pool of a worker per
  core, or one single-worker pool per TPU chip with requests handed to a free one.
- ``ray``: ``RayExecutor``, each evaluation a Ray task whose node still evaluates in a
  worker process of its own (``ray`` is an optional extra, imported lazily).

``make_executor`` builds the one named on a command line (``--executor local|ray``).
App-side package: nothing here imports JAX, and nothing here may import ``sessions``,
``agents`` or ``tui`` (the layers above).
"""

from __future__ import annotations

from tilewright.kernels.judge.protocol import (
    STATES,
    ExecutorError,
    Judge,
    JudgeState,
    ProgressFrame,
    ProgressListener,
    StateListener,
    combined_state,
    on_chips,
)
from tilewright.kernels.pool.env import chip_env, local_tpu_chips, usable_cores
from tilewright.kernels.pool.local import LocalExecutor, local_worker_count
from tilewright.kernels.pool.ray import RayExecutor

EXECUTORS = ("local", "ray")

__all__ = [
    "EXECUTORS", "STATES", "ExecutorError", "Judge", "JudgeState",
    "LocalExecutor", "ProgressFrame", "ProgressListener", "RayExecutor", "StateListener",
    "chip_env", "combined_state", "local_tpu_chips", "local_worker_count", "make_executor",
    "on_chips", "usable_cores",
]


def make_executor(kind: str, workers: int | None = None, address: str | None = None,
                  ) -> LocalExecutor | RayExecutor:
    """The executor named on the command line (``--executor local|ray``)."""
    if kind == "local":
        if address:
            raise ExecutorError("--address only applies to --executor ray")
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(address=address, workers=workers)
    raise ExecutorError(f"unknown executor {kind!r}: choose one of {', '.join(EXECUTORS)}")
