"""``tilewright auto``: a headless autonomous run, one progress line per step.

The same controller the TUI drives, in autonomous mode from the start, until a budget
or stop rule ends it. SIGINT/SIGTERM (Ctrl-C) cancel whatever runs, write ``auto.stop``
(``user``) and ``session.end``, close the workers and still print the summary: the
session is saved and can be resumed with ``--resume``. A kill -9 loses at most the
event being written; ``--resume`` folds the session and carries on appending.

Exit codes: 0 when a correct version was found; 1 when none was, when the agent failed
(``agent_failed``) or when the session could not be written (a full disk, a read-only
directory: the error is printed and, where the disk still allows, recorded); 130 when
interrupted. A session another process is writing is refused (``SessionLockedError``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TextIO

from agents.config import Config
from kernels.result import is_interpret
from sessions.autonomy import ControllerSettings
from sessions.log import SessionLog, SessionWriteError, default_sessions_dir, resolve
from sessions.state import SessionState, fold
from sessions.tasks import task_for_header, task_header

AUTO_SCHEMA = "tilewright.auto/1"


def app_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilewright")
    except PackageNotFoundError:
        return "0+unknown"


class Progress:
    """Prints one line per finished evaluation, plus stops and errors."""

    def __init__(self, state: SessionState, out: TextIO) -> None:
        self.state = state
        self.out = out

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("live"):
            return
        kind = event["type"]
        if kind == "run.result" and not event.get("cancelled"):
            self._step(event)
        elif kind == "auto.stop":
            print(f"stop: {event['reason']}", file=self.out, flush=True)
        elif kind == "error":
            print(f"error ({event.get('where')}): {event.get('message')}", file=self.out,
                  flush=True)
        elif kind == "agent.finished":
            print(f"agent finished: {event.get('message')}", file=self.out, flush=True)

    def _step(self, event: dict[str, Any]) -> None:
        s = self.state
        v = s.versions.get(event["version"])
        speed = f"{event['speedup']:.3f}x" if event.get("speedup") is not None else "-"
        best = f"{s.best_speedup:.3f}x (v{s.best})" if s.best is not None else "none yet"
        summary = (v.summary if v else "")[:48]
        print(f"[{s.auto_spent.iterations:>3}] v{event['version']:<3} {summary:<48} "
              f"{event['status']:<13} {speed:>9}  best {best}  "
              f"tok {s.spent.tokens}  t {event['t']:.1f}s", file=self.out, flush=True)


def summary(log_path: Path, state: SessionState, interrupted: bool) -> dict[str, Any]:
    best = state.versions.get(state.best) if state.best is not None else None
    current = state.versions.get(state.current) if state.current is not None else None
    return {
        "schema": AUTO_SCHEMA, "session": str(log_path), "session_id": log_path.name,
        "task": (state.header.get("task") or {}).get("name"),
        "backend": state.header.get("backend"),
        "iterations": state.spent.iterations, "evaluations": state.spent.runs,
        "best_version": best.number if best else None,
        "best_status": best.status if best else (current.status if current else None),
        "best_speedup": best.speedup if best else None,
        "stop_reason": state.auto_stops[-1]["reason"] if state.auto_stops else None,
        "interrupted": interrupted,
        "tokens": state.spent.tokens, "cost_usd": round(state.spent.cost_usd, 6),
        "cost_known": not state.spent.cost_unknown, "cost": state.spent.cost_text(),
        "versions": [{"version": v.number, "origin": v.origin, "status": v.status,
                      "speedup": v.speedup, "summary": v.summary}
                     for v in state.versions.values()],
    }


def print_summary(data: dict[str, Any], out: TextIO) -> None:
    speed = f"{data['best_speedup']:.3f}x" if data["best_speedup"] is not None else "-"
    best = f"v{data['best_version']}" if data["best_version"] else "no correct version"
    print(f"\n{data['task']}: {data['iterations']} iterations, {data['evaluations']} "
          f"evaluations; best {best} ({data['best_status'] or '-'}, {speed})", file=out)
    print(f"stopped: {data['stop_reason'] or '-'}{' (interrupted)' if data['interrupted'] else ''}"
          f"; tokens {data['tokens']}, cost {data['cost']}", file=out)
    backend = data.get("backend") or {}
    if is_interpret(backend):
        print("timings: TPU interpret mode on the CPU (simulated, not TPU performance)",
              file=out)
    print(f"session: {data['session']}", file=out)


async def run_auto(args: Any, config: Config | dict[str, Any]) -> int:
    from agents import brief, make_agent
    from agents.config import coerce
    from kernels.workers import EvalOptions, WorkerPool
    from sessions.controller import Controller
    from sessions.evaluator import PoolEvaluator

    out = sys.stderr if args.json else sys.stdout
    sessions_dir = Path(args.session_dir).expanduser() if args.session_dir \
        else default_sessions_dir()
    log = state = None
    if args.resume:
        log, loaded = SessionLog.open(resolve(args.resume, sessions_dir))
        for warning in loaded.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        state = fold(loaded.header, loaded.events)
        task = task_for_header(loaded.header)
        options = EvalOptions(**(loaded.header.get("eval_options") or {}))
    else:
        from kernels.loaders import load_task

        task = load_task(args.task, args.overrides or None)
        options = EvalOptions(trials=args.trials, time_budget_s=args.time_budget)
    config = coerce(config)
    agent = make_agent(args.agent or config.agent.kind, config)  # type: ignore[arg-type]
    settings = ControllerSettings.from_config(config)
    if args.budget is not None:
        settings = replace(settings, budgets=replace(settings.budgets, iterations=args.budget))
    if args.target is not None:
        settings = replace(settings, target_speedup=args.target)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with WorkerPool() as pool:
        evaluator = PoolEvaluator(pool, options)
        backend = await evaluator.backend()
        if log is None:
            sessions_dir.mkdir(parents=True, exist_ok=True)
            log = SessionLog.create(
                sessions_dir, task=task_header(task, args.overrides),
                backend={**asdict(backend), "label": backend.label()}, agent=agent.label,
                app_version=app_version(), extra={"eval_options": asdict(options)})
        print(f"session {log.id} · {task.name} · {backend.label()} · {agent.label}",
              file=out, flush=True)
        controller = Controller(log, task, brief(task), agent, evaluator, settings,
                                state=state)
        controller.subscribe(Progress(controller.state, out))
        await controller.start()
        controller.set_mode("auto", by="user")
        waiter = asyncio.ensure_future(controller.wait_idle())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        interrupted = stop.is_set()
        stopper.cancel()
        if interrupted:
            print("interrupted: stopping cleanly (the session is saved)", file=out, flush=True)
        try:
            await controller.close("interrupted" if interrupted else "completed")
        except SessionWriteError:
            pass  # already in log.write_error; reported below
        finally:
            log.close()
        waiter.cancel()
        if not waiter.cancelled() and waiter.done() and waiter.exception() is not None \
                and log.write_error is None:
            raise waiter.exception()  # type: ignore[misc]
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
    data = summary(log.path, controller.state, interrupted)
    if log.write_error is not None:
        data["stop_reason"] = "write_error"
        data["error"] = str(log.write_error)
    if args.json:
        print(json.dumps(data, indent=2))
    print_summary(data, out)
    if log.write_error is not None:
        print(f"tilewright auto: {log.write_error}", file=sys.stderr)
        return 1
    if interrupted:
        return 130
    if data["stop_reason"] == "agent_failed":
        return 1
    return 0 if data["best_version"] else 1
