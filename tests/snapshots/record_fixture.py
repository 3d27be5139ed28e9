"""Record the session the TUI snapshot tests show: ``python tests/snapshots/record_fixture.py``.

A real session on the bundled ``gelu`` task: the real controller, a real worker pool
(TPU interpret mode on the CPU), the scripted agent. v1 runs, p1 (taller blocks) is
approved and runs as v2, v2 is profiled, p2 (a tuning) is rejected with a note, p3 (a
kernel with a syntax error) is approved and fails to compile as v3, and the fixer's p4
is left pending. The profile's Chrome trace is trimmed and stored inside the session
(``profiles/<run>/trace.json``, referenced by a relative path) so the fixture is
self-contained. Re-recording changes measured numbers, so the snapshots change too.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scripted_agent import ScriptedAgent, kernel, tuning  # noqa: E402

from tilewright.agents import brief  # noqa: E402
from tilewright.kernels.tasks.loaders import load_task  # noqa: E402
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool  # noqa: E402
from tilewright.sessions.autonomy import ControllerSettings  # noqa: E402
from tilewright.sessions.controller import Controller  # noqa: E402
from tilewright.sessions.evaluator import PoolEvaluator  # noqa: E402
from tilewright.sessions.log import SessionLog  # noqa: E402

TARGET = HERE / "session_gelu"
TRACE_EVENTS = 400  # enough to draw the timeline; keeps the fixture small


async def record(tmp: Path) -> Path:
    task = load_task("gelu")
    start = task.starting_source() or ""
    taller = start.replace("BLOCK_ROWS = 64", "BLOCK_ROWS = 128")
    broken = taller.replace("def gelu_kernel(x_ref, o_ref):", "def gelu_kernel(x_ref, o_ref)")
    fixed = taller.replace("BLOCK_ROWS = 128", "BLOCK_ROWS = 256")
    agent = ScriptedAgent([
        kernel(taller, "taller row blocks (64 -> 128): half the grid steps"),
        tuning("wider column blocks", BLOCK_COLS=512),
        kernel(broken, "fuse the scaling into one expression"),
        kernel(fixed, "restore the colon; rows 256"),
    ], text="Each grid step pays a fixed pipeline cost, so **fewer, larger blocks** "
            "should help this memory-bound kernel.\n\n- rows: 64 -> 128\n- cols: kept")
    async with WorkerPool() as pool:
        evaluator = PoolEvaluator(pool, EvalOptions(trials=1, time_budget_s=0.05))
        backend = await evaluator.backend()
        log = SessionLog.create(tmp, task={"name": task.name, "root": "gelu",
                                           "layout": task.layout},
                                backend={**backend.__dict__, "label": backend.label()},
                                agent=agent.label, app_version="fixture")
        controller = Controller(log, task, brief(task), agent, evaluator,
                                ControllerSettings(auto_fix_attempts=1))
        await controller.start()
        controller.run()
        await controller.wait_idle()
        controller.approve()  # p1 -> v2, runs
        await controller.wait_idle()
        controller.profile()
        await controller.wait_idle()
        controller.reject("keep BLOCK_COLS at 256: rows first")
        await controller.wait_idle()
        controller.approve()  # p3 -> v3, does not compile; the fixer proposes p4
        await controller.wait_idle()
        path = log.path
        log.close()
    return path


def make_self_contained(session: Path) -> None:
    events_path = session / "events.jsonl"
    lines = events_path.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        event = json.loads(line)
        if event["type"] == "profile.result" and event.get("profile_blob"):
            blob = session / "blobs" / event["profile_blob"]
            profile = json.loads(blob.read_text())
            timeline = profile.get("timeline") or {}
            trace = json.loads(Path(timeline["chrome_trace"]).read_text())
            kept = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
            spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
            tracks = sorted({(e.get("pid"), e.get("tid")) for e in spans}, key=str)
            for track in tracks:  # an even share of every track
                kept += [e for e in spans if (e.get("pid"), e.get("tid")) == track][
                    :TRACE_EVENTS // max(1, len(tracks))]
            rel = Path("profiles") / event["run"] / "trace.json"
            (session / rel).parent.mkdir(parents=True, exist_ok=True)
            (session / rel).write_text(json.dumps({"traceEvents": kept}))
            timeline["chrome_trace"] = str(rel)
            shutil.rmtree(session / rel.parent / "plugins", ignore_errors=True)  # raw xprof
            for key in ("logdir", "run_dir", "perfetto"):
                profile.pop(key, None)
            blob.unlink()
            sha = _put(session, json.dumps(profile, sort_keys=True))
            event["profile_blob"] = sha
            line = json.dumps(event, separators=(",", ":"))
        out.append(line)
    events_path.write_text("\n".join(out) + "\n")


def _put(session: Path, text: str) -> str:
    import hashlib

    sha = hashlib.sha256(text.encode()).hexdigest()
    (session / "blobs" / sha).write_text(text)
    return sha


def main() -> None:
    tmp = HERE / "_recording"
    shutil.rmtree(tmp, ignore_errors=True)
    session = asyncio.run(record(tmp))
    make_self_contained(session)
    shutil.rmtree(TARGET, ignore_errors=True)
    shutil.copytree(session, TARGET)
    shutil.rmtree(tmp)
    print(f"recorded {TARGET}")


if __name__ == "__main__":
    main()
