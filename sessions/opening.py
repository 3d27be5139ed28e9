"""Opening, resuming and closing sessions: the one place that builds a session's parts.

Every front end comes here: the TUI (``tui.launch``), ``tilewright auto``
(``sessions.cli.headless``), the graph search (``open_search`` for ``tilewright review``,
``open_task_search`` for ``tilewright search``) and a branch of a recorded session
(``sessions.recorded.branch``). So a session is opened one way whichever front end opened it:

- the task: a new session loads ``--task`` with its ``--set`` overrides; a resumed one
  rebuilds the task its header records (``sessions.tasks.task_for_header``: same
  directory, same overrides, a bundled task of the same name when the directory moved);
- the header: written by ``create_log`` only — the task as ``task_header`` describes it
  (absolute root, overrides, effective shapes), the backend with its label, the agent,
  the evaluation options the session is judged with, the app version;
- the evaluation options: explicit ones (command-line flags) over a resumed session's
  recorded ones over the config's ``[eval]`` table;
- the chip the gauges and roofline use (``choose_chip``) and that the controller
  diagnoses profiles for;
- failures: an ``OpenError`` with the message and the next step (and whether the offline
  agent would open it), for the front end to present.

``open_session`` returns a ``Session`` that owns what it started (its worker pool) and
releases it in ``close``; ``open_search`` does the same for a search and its executor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tilewright.agents.config import Config, ConfigError, coerce
from tilewright.kernels.judge.result import Backend
from tilewright.kernels.tasks.task import Task, TaskError
from tilewright.profiling.chips import DEFAULT_TPU
from tilewright.sessions.core.log_open import create_log, options_from, reopen_log
from tilewright.sessions.errors import OpenError
from tilewright.sessions.log import LoadedSession, SessionLog, default_sessions_dir
from tilewright.sessions.tasks import task_for_header

if TYPE_CHECKING:
    from tilewright.agents.base import Agent
    from tilewright.kernels.judge.protocol import Judge
    from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
    from tilewright.sessions.autonomy import ControllerSettings
    from tilewright.sessions.control.controller import Controller
    from tilewright.sessions.search.driver import Search
    from tilewright.sessions.search.graph import SearchConfig

DEFAULT_TASK = "softmax"
CPU_TARGET_CHIP = DEFAULT_TPU  # what interpret mode on a CPU host is judged against


@dataclass(frozen=True)
class SessionRequest:
    """What a front end asks for. ``task`` or ``resume`` (neither: ``default_task``)."""

    task: str | None = None  # directory or bundled name
    overrides: Mapping[str, str] | None = None  # --set KEY=VALUE
    resume: str | None = None  # session id, prefix or directory
    sessions_dir: str | Path | None = None  # None: the user data dir's
    agent: str | None = None  # offline | anthropic | openai | auto (None: the config's)
    eval: Mapping[str, Any] = field(default_factory=dict)  # explicit EvalOptions fields
    default_task: str | None = None


@dataclass(frozen=True)
class ChipChoice:
    key: str
    label: str
    vmem_bytes: float | None


def sessions_dir_for(value: str | Path | None) -> Path:
    return Path(value).expanduser() if value else default_sessions_dir()


def choose_chip(config: Config | Mapping[str, Any] | None,
                backend: Backend | None = None, explicit: str | None = None) -> ChipChoice:
    """The one chip of a session: the judge compiles and estimates for it, and the prompt,
    the gauges, the diagnosis, the profile and the roofline reason about it. ``explicit``
    (a flag, or what a resumed session recorded), else the config's (``[eval] chip``,
    else ``[backend] chip``), else the device's, else (on a CPU host, where kernels run
    in TPU interpret mode) a TPU v5e target."""
    from tilewright.profiling.chips import chip_for_device, get_chip

    name = explicit or configured_chip(config)
    try:
        if name:
            chip = get_chip(str(name))
        elif backend is not None and backend.platform != "cpu" and backend.device_kind:
            chip = chip_for_device(backend.platform, backend.device_kind)
        else:
            chip = get_chip(CPU_TARGET_CHIP)
    except KeyError as exc:
        raise OpenError(str(exc), "set [backend] chip in the config file "
                                  "(`tilewright config` shows where it is)") from None
    return ChipChoice(chip.name, chip.label, float(chip.scoped_vmem_bytes or chip.vmem_bytes))


def _is_tpu(name: str) -> bool:
    from tilewright.profiling.chips import get_chip

    try:
        return get_chip(name).kind == "tpu"
    except KeyError:
        return False


def configured_chip(config: Config | Mapping[str, Any] | None) -> str | None:
    """The chip the config names (``kernels.judge.options.configured_chip``: ``[eval]
    chip``, else ``[backend] chip``); None: the device's own."""
    from tilewright.kernels.judge.options import configured_chip as from_config

    return from_config(coerce(config))


def eval_options(config: Config | Mapping[str, Any] | None,
                 recorded: Mapping[str, Any] | None = None,
                 explicit: Mapping[str, Any] | None = None,
                 defaults: Mapping[str, Any] | None = None) -> EvalOptions:
    """``EvalOptions``: ``defaults`` (a front end's own), then the config's ``[eval]``,
    then what a resumed session recorded, then ``explicit`` ones (flags)."""
    try:
        table = coerce(config).eval
    except ConfigError as exc:
        raise OpenError(str(exc), ConfigError.next_step) from None
    return options_from({**(defaults or {}), **table, **(recorded or {}), **(explicit or {})})


def make_session_agent(kind: str | None, config: Config | Mapping[str, Any] | None
                       ) -> Agent:
    from tilewright.agents import make_agent
    from tilewright.agents.errors import AgentError

    config = coerce(config)
    try:
        return make_agent(kind or config.agent.kind, config)  # type: ignore[arg-type]
    except AgentError as exc:
        raise OpenError(str(exc), getattr(exc, "next_step", None)
                        or "run with --agent offline, or export ANTHROPIC_API_KEY",
                        offline_fallback=True) from None


def parse_set(items: list[str] | None) -> dict[str, str]:
    """``--set KEY=VALUE`` pairs; a malformed one is an ``OpenError``."""
    from tilewright.kernels.tasks.loaders import parse_overrides

    try:
        return parse_overrides(items)
    except ValueError as exc:
        raise OpenError(str(exc), "write each override as --set KEY=VALUE") from None


def agent_in_effect(config: Config | Mapping[str, Any] | None,
                    kind: str | None = None) -> dict[str, Any]:
    """The agent a session would open with: provider, model, endpoint and where its key
    comes from (never the key), or ``{"error": ...}`` saying why it cannot be made."""
    from tilewright.agents import describe_agent
    from tilewright.agents.errors import AgentError

    try:
        return describe_agent(kind, coerce(config))
    except AgentError as exc:
        return {"error": str(exc)}


def load_request_task(request: SessionRequest, header: Mapping[str, Any] | None = None
                      ) -> Task:
    """The task a new session names, or the one a resumed session's header records."""
    from tilewright.kernels.tasks.loaders import load_task

    try:
        if header is not None and request.task is None:
            return task_for_header(dict(header))
        spec = request.task or request.default_task
        if spec is None:
            raise OpenError("no task: give --task DIR|NAME or --resume SESSION",
                            "`tilewright tasks` lists the bundled tasks")
        return load_task(spec, dict(request.overrides or {}) or None)
    except TaskError as exc:
        raise OpenError(str(exc), "check the task directory, or pass --task with a "
                                  "bundled task name (e.g. softmax)") from None


# -- a live session (the controller) ------------------------------------------------------


class Session:
    """An open session: its controller and what was started for it. ``await close()``
    ends the session (``session.end``) and releases the workers it started."""

    def __init__(self, controller: Controller, backend: Backend | None, chip: ChipChoice,
                 warnings: list[str], owned: WorkerPool | None = None) -> None:
        self.controller = controller
        self.backend = backend
        self.chip = chip
        self.warnings = warnings  # what loading a resumed log noticed (a torn tail, ...)
        self._owned = owned  # a WorkerPool this session started, closed with it

    @property
    def log(self) -> SessionLog:
        return self.controller.log

    @property
    def task(self) -> Task:
        return self.controller.task

    @property
    def agent(self) -> Agent:
        return self.controller.agent

    async def close(self, reason: str = "closed") -> None:
        """Write ``session.end`` (unless already closed), then stop the workers."""
        try:
            await self.controller.close(reason)
        finally:
            self.controller.log.close()
            await self.release()

    async def release(self) -> None:
        """Stop the workers this session started (the session itself stays as it is)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.close()


async def start_controller(task: Task, agent: Agent, evaluator: Judge,
                           config: Config | Mapping[str, Any] | None, *,
                           sessions_dir: str | Path,
                           backend: Backend | Mapping[str, Any] | None, chip: ChipChoice,
                           log: SessionLog | None = None,
                           loaded: LoadedSession | None = None,
                           options: EvalOptions | None = None,
                           settings: ControllerSettings | None = None) -> Controller:
    """A controller over a new (or reopened) session log, started."""
    from tilewright.agents import brief
    from tilewright.sessions.autonomy import ControllerSettings
    from tilewright.sessions.brief import with_inputs
    from tilewright.sessions.control.controller import Controller
    from tilewright.sessions.state import fold

    # The task's own code first: a reference that fails leaves no session behind.
    problems: list[dict[str, Any]] = []
    task_brief = await with_inputs(brief(task), task, evaluator, problems)
    if problems:  # no kernel could be judged against it
        found = problems[0]
        where = found.get("where") or (f"{found['file']}:{found['line']}"
                                       if found.get("line") else found.get("file"))
        raise OpenError(f"the task {task.name} cannot be used: {found.get('message')}"
                        + (f" ({where})" if where else ""),
                        f"fix {where or 'the task files'} (the task's own code, not a "
                        f"kernel), then open it again; `tilewright tasks {task.root}` checks it")
    if log is None:
        log = create_log(sessions_dir, task=task, backend=backend, agent=agent.label,
                         eval_options=options)
        state = None
    else:
        assert loaded is not None, "a reopened log comes with what was loaded"
        state = fold(loaded.header, loaded.events)
    controller = Controller(log, task, task_brief, agent, evaluator,
                            settings or ControllerSettings.from_config(config), state=state,
                            chip=chip.key)
    await controller.start()
    return controller


async def open_session(request: SessionRequest, config: Config | Mapping[str, Any] | None,
                       *, settings: ControllerSettings | None = None,
                       eval_defaults: Mapping[str, Any] | None = None) -> Session:
    """Open (or resume) a session with one worker process; the caller closes it."""
    from tilewright.kernels.pool.workers import WorkerPool
    from tilewright.sessions.evaluator import PoolEvaluator

    config = coerce(config)
    sessions_dir = sessions_dir_for(request.sessions_dir)
    log = loaded = None
    if request.resume:
        log, loaded = reopen_log(request.resume, sessions_dir)
    try:
        task = load_request_task(request, loaded.header if loaded else None)
        options = eval_options(config, (loaded.header.get("eval_options") if loaded else None),
                               request.eval, eval_defaults)
        agent = make_session_agent(request.agent, config)
    except BaseException:
        if log is not None:
            log.close()
        raise
    pool = WorkerPool(1)
    try:
        await pool.start()
        evaluator = PoolEvaluator(pool, options)
        backend = await evaluator.backend()
        # One chip for everything: the judge compiles for the chip the session shows.
        chip = choose_chip(config, backend, options.chip)
        if _is_tpu(chip.key):
            evaluator.options = options = replace(options, chip=chip.key)
            evaluator.profile_options = replace(evaluator.profile_options, chip=chip.key)
    except OpenError:
        await pool.close()
        if log is not None:
            log.close()
        raise
    except Exception as exc:
        await pool.close()
        if log is not None:
            log.close()
        raise OpenError(f"the JAX worker did not start: {exc}",
                        "run `tilewright eval --task softmax` to see the worker's "
                        "own error output") from exc
    try:
        controller = await start_controller(
            task, agent, evaluator, config, sessions_dir=sessions_dir, backend=backend,
            chip=chip, log=log, loaded=loaded, options=options, settings=settings)
    except BaseException:
        await pool.close()
        if log is not None:
            log.close()
        raise
    return Session(controller, backend, chip, list(loaded.warnings) if loaded else [],
                   owned=pool)


# -- a search -------------------------------------------------------------------------------


class SearchSession:
    """An open search and the executor started for it; ``await close()`` releases both."""

    def __init__(self, search: Search, executor: Judge) -> None:
        self.search = search
        self.executor = executor

    async def close(self) -> None:
        try:
            self.search.close()
        finally:
            await self.executor.close()


async def open_search(request: SessionRequest, config: Config | Mapping[str, Any] | None,
                      search_config: SearchConfig, *, workers: int = 1) -> SearchSession:
    """A new search over ``request.task`` on local worker processes (``tilewright
    review``); ``tilewright search`` runs suites and opens each task's search with
    ``Search.create`` / ``Search.open`` over its own executor."""
    from tilewright.agents import brief
    from tilewright.kernels.pool import LocalExecutor
    from tilewright.sessions.search.driver import Search

    config = coerce(config)
    task = load_request_task(request)
    agent = make_session_agent(request.agent, config)
    options = eval_options(config, None, request.eval)
    executor = LocalExecutor(workers=workers)
    try:
        await executor.start()
        from tilewright.sessions.brief import with_inputs

        task_brief = await with_inputs(brief(task), task, executor)
        search = Search.create(sessions_dir_for(request.sessions_dir), task, task_brief,
                               agent, executor, search_config, eval_options=options,
                               backend=await executor.backend())
    except BaseException:
        await executor.close()
        raise
    return SearchSession(search, executor)


async def open_task_search(task: Task, agent: Agent, executor: Judge,
                           config: SearchConfig, *, sessions_dir: str | Path,
                           existing: Path | None, options: EvalOptions | None,
                           backend: Backend | Mapping[str, Any] | None,
                           meta: Mapping[str, Any] | None = None) -> Search:
    """One task's search over a started executor (``tilewright search``): ``existing``
    resumed with the recorded search shape and this command's budget (also when it had
    ended on a smaller one), or a new search session under ``sessions_dir``."""
    from tilewright.agents import brief
    from tilewright.sessions.brief import with_inputs
    from tilewright.sessions.search.driver import Search

    task_brief = await with_inputs(brief(task), task, executor)
    if existing is not None:
        return Search.open(existing, task, task_brief, agent, executor, budget=config.budget,
                           eval_options=options, reopen=True)
    return Search.create(sessions_dir, task, task_brief, agent, executor, config,
                         eval_options=options, meta=dict(meta or {}), backend=backend)
