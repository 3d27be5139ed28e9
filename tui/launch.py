"""Opening a live session for the TUI: task, agent, worker pool, log, controller.

Everything here is slow or can fail (a JAX worker takes seconds to start; a task
directory can be broken; a key can be missing), so the app paints first and calls
``open_live`` from a worker; a ``LaunchError`` carries the message and the next step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agents.config import Config
from tui.link import LiveLink

DEFAULT_TASK = "softmax"
CPU_TARGET_CHIP = "v5e"  # what interpret mode on a CPU host is judged against


class LaunchError(Exception):
    def __init__(self, message: str, next_step: str = "", offline_fallback: bool = False
                 ) -> None:
        super().__init__(message)
        self.next_step = next_step
        self.offline_fallback = offline_fallback  # the offline agent would open it


@dataclass(frozen=True)
class LaunchOptions:
    task: str | None = None
    resume: str | None = None
    session_dir: str | None = None
    agent: str | None = None  # offline | anthropic | openai | auto (None: the config's)


@dataclass(frozen=True)
class ChipChoice:
    key: str
    label: str
    vmem_bytes: float | None


def choose_chip(config: Config | dict[str, Any], platform: str | None = None,
                device_kind: str | None = None) -> ChipChoice:
    """The chip the gauges and roofline use: the config's, else the device's, else (on a
    CPU host, where kernels run in TPU interpret mode) a TPU v5e target."""
    from agents.config import coerce
    from profiling.chips import chip_for_device, get_chip

    name = coerce(config).backend.chip
    try:
        if name:
            chip = get_chip(str(name))
        elif platform and platform != "cpu" and device_kind:
            chip = chip_for_device(platform, device_kind)
        else:
            chip = get_chip(CPU_TARGET_CHIP)
    except KeyError as exc:
        raise LaunchError(str(exc), "set [backend] chip in the config file "
                                    "(`tilewright config` shows where it is)") from None
    return ChipChoice(chip.name, chip.label, float(chip.scoped_vmem_bytes or chip.vmem_bytes))


def _task(spec: str | None, resume_header: dict[str, Any] | None):
    from kernels.loaders import load_task
    from kernels.task import TaskError

    if spec is None and resume_header is not None:
        task_info = resume_header.get("task") or {}
        spec = task_info.get("root") or task_info.get("name")
    try:
        return load_task(spec or DEFAULT_TASK)
    except TaskError as exc:
        raise LaunchError(str(exc), "check the task directory, or pass --task with a "
                                    "bundled task name (e.g. softmax)") from None


def _agent(kind: str, config: dict[str, Any]):
    from agents import make_agent
    from agents.errors import AgentError

    try:
        return make_agent(kind, config)  # type: ignore[arg-type]
    except AgentError as exc:
        raise LaunchError(str(exc), getattr(exc, "next_step", None)
                          or "run with --agent offline, or export ANTHROPIC_API_KEY",
                          offline_fallback=True) from None


def eval_options(config: Config | dict[str, Any]):
    """EvalOptions from the optional ``[eval]`` table (validated by ``agents.config``)."""
    from agents.config import ConfigError, coerce
    from kernels.workers import EvalOptions

    try:
        return EvalOptions(**coerce(config).eval)
    except ConfigError as exc:
        raise LaunchError(str(exc), ConfigError.next_step) from None


async def open_live(options: LaunchOptions, config: Config | dict[str, Any],
                    app_version: str = "0") -> tuple[LiveLink, ChipChoice]:
    """Start (or resume) a session; the caller owns the returned link and closes it."""
    from kernels.workers import WorkerPool
    from sessions.evaluator import PoolEvaluator
    from sessions.log import SessionError, SessionLog, default_sessions_dir, resolve

    sessions_dir = Path(options.session_dir).expanduser() if options.session_dir \
        else default_sessions_dir()
    log = loaded = None
    if options.resume:
        try:
            log, loaded = SessionLog.open(resolve(options.resume, sessions_dir))
        except SessionError as exc:
            raise LaunchError(str(exc), "`tilewright sessions` lists the sessions") from None
    task = _task(options.task, loaded.header if loaded else None)
    from agents.config import coerce

    config = coerce(config)
    kind = options.agent or config.agent.kind
    agent = _agent(kind, config)
    pool = WorkerPool(1)
    try:
        await pool.start()
        evaluator = PoolEvaluator(pool, eval_options(config))
        backend = await evaluator.backend()
    except Exception as exc:
        await pool.close()
        raise LaunchError(f"the JAX worker did not start: {exc}",
                          "run `tilewright eval --task softmax` to see the worker's "
                          "own error output") from exc
    chip = choose_chip(config, backend.platform, backend.device_kind)
    backend_json = {**asdict(backend), "label": backend.label()}
    link = await start_session(task, agent, evaluator, config, sessions_dir=sessions_dir,
                               backend=backend_json, chip=chip, log=log, loaded=loaded,
                               app_version=app_version, on_close=pool.close)
    return link, chip


async def start_session(task: Any, agent: Any, evaluator: Any,
                        config: Config | dict[str, Any], *,
                        sessions_dir: Path, backend: dict[str, Any] | None, chip: ChipChoice,
                        log: Any = None, loaded: Any = None, app_version: str = "0",
                        on_close: Any = None) -> LiveLink:
    """A controller over a new (or reopened) session log, started; wrapped in a link."""
    from agents import brief
    from sessions.autonomy import ControllerSettings
    from sessions.controller import Controller
    from sessions.log import SessionLog
    from sessions.state import fold

    if log is None:
        sessions_dir.mkdir(parents=True, exist_ok=True)
        from sessions.tasks import task_header

        log = SessionLog.create(sessions_dir,
                                task=task_header(task, task.meta.get("overrides")),
                                backend=backend, agent=agent.label, app_version=app_version)
        state = None
    else:
        state = fold(loaded.header, loaded.events)
    controller = Controller(log, task, brief(task), agent, evaluator,
                            ControllerSettings.from_config(config), state=state,
                            chip=chip.key)
    link = LiveLink(controller, agent_label=agent.label, chip=chip.label, on_close=on_close)
    await controller.start()
    return link
