"""A controller under test: made on a fresh session log with a scripted agent and any
judge (the in-process ``MarkedJudge`` where the worker is not what a test specifies),
its events collected, and its replay checked against its live state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripted_agent import ScriptedAgent

from tilewright.agents import brief
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.autonomy import Budgets, ControllerSettings
from tilewright.sessions.control.controller import Controller
from tilewright.sessions.log import SessionLog, load
from tilewright.sessions.state import fold

NO_LIMITS = Budgets(iterations=None, tokens=None, cost_usd=None, wall_s=None)


def src(status: str = "correct", speedup: float = 1.0, tag: str = "") -> str:
    return f"def kernel(x):\n    return x  # eval: {status} {speedup} {tag}\n"


def make(tmp_path: Path, task: Task, agent: ScriptedAgent, evaluator: Any,
         settings: ControllerSettings | None = None) -> tuple[Controller, list[dict]]:
    log = SessionLog.create(tmp_path, task={"name": task.name, "root": str(task.root),
                                            "layout": task.layout},
                            backend=None, agent=agent.name, app_version="test")
    controller = Controller(log, task, brief(task), agent, evaluator,
                            settings or ControllerSettings())
    seen: list[dict] = []
    controller.subscribe(seen.append)
    return controller, seen


def types(seen: list[dict]) -> list[str]:
    return [e["type"] for e in seen if not e.get("live")]


def assert_replay_matches(controller: Controller) -> None:
    loaded = load(controller.log.path)
    assert not loaded.warnings
    assert fold(loaded.header, loaded.events).snapshot() == controller.state.snapshot()
