"""The real app under test on a live session: made over a judge (a worker pool, or a
test double where the worker is not what is tested) with a scripted agent and a fake
clock, settled until the controller is idle and the screen has caught up, and its
recorded events read back."""

from __future__ import annotations

from pathlib import Path

from waiting import until

from tilewright.kernels.pool.workers import EvalOptions
from tilewright.sessions.evaluator import PoolEvaluator
from tilewright.sessions.log import load
from tilewright.tui.app import TilewrightApp
from tilewright.tui.launch import ChipChoice, start_session
from tilewright.tui.screens.modals import ErrorModal

CHIP = ChipChoice("v5e", "TPU v5e", 16 * 2**20)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_app(tmp_path: Path, task, agent, judge, clock: FakeClock | None = None,
             config: dict | None = None) -> TilewrightApp:
    evaluator = PoolEvaluator(judge, EvalOptions(trials=1, time_budget_s=0.05, timeout_s=120))
    config = config or {}

    async def opener():
        link = await start_session(task, agent, evaluator, config, sessions_dir=tmp_path,
                                   backend={"platform": "cpu", "mode": "tpu-interpret",
                                            "label": "CPU (TPU interpret)"}, chip=CHIP)
        return link, CHIP

    return TilewrightApp(config, opener, clock=clock or FakeClock())


async def settle(app: TilewrightApp, pilot) -> None:
    """Wait for the session to open, the controller to go idle, and the UI to catch up."""
    await app.workers.wait_for_complete()
    await until(lambda: app.link is not None, "the opener worker to attach the session")
    await app.link.wait_idle()
    for _ in range(3):  # events posted by the last step, then the draw they schedule
        await pilot.pause()
    modal = app.screen
    assert not isinstance(modal, ErrorModal), f"{modal.title_text}: {modal.message}"


def persisted(app: TilewrightApp) -> list[dict]:
    return load(app.link.path).events


def kinds(app: TilewrightApp) -> list[str]:
    return [e["type"] for e in persisted(app)]
