"""Hostile candidates as an agent's proposals arrive: no state crosses candidates, held-out
stays held out, work outside the kernel is found in loops, nothing raw leaves.

Each attack comes through a session (a scripted agent's proposals in autonomous mode,
judged by real workers in TPU interpret mode), as a model's would. The task: 2*tanh(x)
at a small check shape, a held-out one, and a production shape.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scripted_agent import ScriptedAgent, kernel

from tilewright.agents import brief
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.autonomy import Budgets, ControllerSettings
from tilewright.sessions.control.controller import Controller
from tilewright.sessions.evaluator import PoolEvaluator
from tilewright.sessions.log import SessionLog, load, read_json_blob
from tilewright.sessions.state import fold

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parent.parent
QUICK = EvalOptions(trials=3, timeout_s=180.0, timing=False, lowering=True)

REFERENCE = """
import jax
import jax.numpy as jnp

def make_inputs(key, rows, cols):
    return (jax.random.normal(key, (rows, cols), jnp.float32),)

def reference(x):
    return jnp.tanh(x) * 2.0
"""

BODY = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

PREAMBLE

def _body(x_ref, o_ref):
    o_ref[...] = EXPR

def kernel(x):
    return pl.pallas_call(_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""


def candidate(expr: str = "jnp.tanh(x_ref[...]) * 2.0", preamble: str = "") -> str:
    return BODY.replace("PREAMBLE", preamble).replace("EXPR", expr)


HONEST = candidate()
# Correct itself (tanh written with exp), it rewrites JAX's own tanh for whoever comes
# next in its process: 0.1% off, so an honest kernel after it would read as wrong.
POISONER = candidate("2.0 * (1.0 - 2.0 / (jnp.exp(2.0 * x_ref[...]) + 1.0))", textwrap.dedent("""
    import jax._src.lax.lax as _lax
    _tanh = _lax.tanh
    _lax.tanh = lambda x, _t=_tanh: _t(x) * 1.001
"""))
# Correct itself, it makes every later kernel trace with its own honest body: a wrong
# kernel after it would read as correct.
BODY_SWAPPER = candidate(preamble=textwrap.dedent("""
    import jax._src.pallas.pallas_call as _pc
    _trace = _pc._trace_kernel_to_jaxpr
    _pc._trace_kernel_to_jaxpr = lambda fun, *a, _t=_trace, **k: _t(_body, *a, **k)
"""))
WRONG = candidate("x_ref[...]")  # not 2*tanh at all
# A native thread no ``threading`` module sees, started at import.
NATIVE_THREAD = candidate(preamble=textwrap.dedent("""
    import ctypes, time
    _libc = ctypes.CDLL(None)
    _RUN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    def _spin(_arg):
        while True:
            time.sleep(0.05)  # the payload: a native thread that stays alive, idle
    _fn = _RUN(_spin)
    _tid = ctypes.c_ulong()
    _libc.pthread_create(ctypes.byref(_tid), None, _fn, None)
"""))
# Prints the shape it is traced at, then fails at the held-out one (rows 128).
SHAPE_LEAK = candidate(preamble=textwrap.dedent("""
    import sys
    _seen = []
"""), expr="jnp.tanh(x_ref[...]) * 2.0").replace(
    "def kernel(x):\n",
    "def kernel(x):\n    print('TRACED-AT', x.shape, file=sys.stderr)\n"
    "    if x.shape[0] == 128:\n        raise ValueError(f'cannot do shape {x.shape}')\n")
# Escapes a terminal obeys: OSC 52 (clipboard), clear screen, a window title.
ESCAPES = "\x1b]52;c;cm0gLXJmIH4=\x07\x1bc\x1b]0;pwned\x07"
# ... printed at import, and raw in a comment of its source (which the workbench shows).
NOISY = candidate(preamble=f"print({ESCAPES!r} + 'NOISY')  # {ESCAPES}")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("isolation") / "tanh2"
    root.mkdir()
    (root / "task.toml").write_text(textwrap.dedent("""
        name = "tanh2"
        atol = 1e-5
        rtol = 1e-5
        [shapes.small]
        rows = 64
        cols = 256
        [shapes.held_out]
        rows = 128
        cols = 256
        held_out = true
        [shapes.prod]
        rows = 1024
        cols = 1024
        size = "large"
        production = true
    """))
    (root / "reference.py").write_text(REFERENCE)
    return root


async def session(tmp_path: Path, task_dir: Path, pool, *sources: tuple[str, str]):
    """A session whose scripted agent proposes ``sources`` ((source, summary) pairs) in
    autonomous mode; returns the controller, closed, and its agent."""
    task = load_task(str(task_dir))
    agent = ScriptedAgent([kernel(src, summary) for src, summary in sources])
    log = SessionLog.create(tmp_path, task={"name": task.name, "root": str(task.root),
                                            "layout": task.layout},
                            backend=None, agent=agent.name, app_version="test")
    controller = Controller(log, task, brief(task), agent, PoolEvaluator(pool, QUICK),
                            ControllerSettings(budgets=Budgets(iterations=len(sources)),
                                               propose_after_run=True))
    await controller.start()
    controller.set_mode("auto")
    await controller.wait_idle()
    await controller.close()
    return controller, agent


def version(controller: Controller, summary: str):
    return next(v for v in controller.state.versions.values() if v.summary == summary)


@ON_MODULE_LOOP
async def test_a_candidate_cannot_decide_the_next_ones_verdict(tmp_path, task_dir,
                                                                worker_pool) -> None:
    c, _agent = await session(tmp_path, task_dir, worker_pool, (POISONER, "poisoner"),
                              (HONEST, "honest"))
    assert version(c, "poisoner").status == "correct"
    # judged in a process the poisoner never ran in: JAX's tanh is JAX's own
    assert version(c, "honest").status == "correct"


@ON_MODULE_LOOP
async def test_a_candidate_cannot_make_the_next_one_correct(tmp_path, task_dir,
                                                             worker_pool) -> None:
    c, _agent = await session(tmp_path, task_dir, worker_pool, (BODY_SWAPPER, "swapper"),
                              (WRONG, "wrong"))
    assert version(c, "swapper").status == "correct"
    wrong = version(c, "wrong")
    assert wrong.status == "incorrect" and not wrong.crownable
    assert c.state.best == version(c, "swapper").number


@ON_MODULE_LOOP
async def test_a_native_thread_is_seen_and_dies_with_its_candidate(tmp_path, task_dir,
                                                                    worker_pool) -> None:
    c, _agent = await session(tmp_path, task_dir, worker_pool, (NATIVE_THREAD, "threaded"),
                              (HONEST, "honest"))
    threaded, honest = version(c, "threaded"), version(c, "honest")
    assert "background_threads" in threaded.flags and not threaded.crownable
    assert "background_threads" not in honest.flags and honest.status == "correct"


@ON_MODULE_LOOP
async def test_held_out_shapes_never_reach_the_agent(tmp_path, task_dir, worker_pool) -> None:
    c, agent = await session(tmp_path, task_dir, worker_pool, (SHAPE_LEAK, "leaky"),
                             (HONEST, "honest"))
    leaky = version(c, "leaky")
    assert leaky.status in ("compile_error", "runtime_error")  # it fails at trace time
    # the request after the failure: what the agent was told of it
    told = json.dumps([r.last_eval for r in agent.requests if r.last_eval], default=str)
    told += " ".join(str(r.notes) for r in agent.requests)
    assert "TRACED-AT" in told  # the visible shape's output is the agent's ...
    assert "(128, 256)" not in told and "128, 256" not in told  # ... the held-out one is not
    assert "withheld from the agent" in told
    # the person sees it: the evaluation keeps it apart
    result = read_json_blob(c.log.path, leaky.result_blob)
    assert "128, 256" in json.dumps(result["extra"]["held_out"])


@ON_MODULE_LOOP
async def test_a_matmul_in_a_loop_of_runtime_length_is_outside_the_kernel(
        tmp_path, task_dir, worker_pool) -> None:
    looped = candidate(preamble=textwrap.dedent("""
        def _outside(x):
            n = (x[0, 0] * 0 + x.shape[1] // 128).astype(jnp.int32)  # run-time trip count
            def body(state):
                i, acc = state
                blk = jax.lax.dynamic_slice_in_dim(x, i * 128, 128, axis=1)
                return i + 1, acc + blk @ jnp.ones((128, x.shape[1]), x.dtype) * 0.0
            return jax.lax.while_loop(lambda s: s[0] < n, body, (0, jnp.zeros_like(x)))[1]
    """)).replace("def kernel(x):\n    return ", "def kernel(x):\n    x = x + _outside(x)\n    return ")
    c, _agent = await session(tmp_path, task_dir, worker_pool, (looped, "looped"))
    flagged = version(c, "looped")
    assert "compute_outside_kernel" in flagged.flags and not flagged.crownable


@ON_MODULE_LOOP
async def test_control_characters_never_reach_a_terminal_or_a_file(tmp_path, task_dir,
                                                                    worker_pool) -> None:
    hostile = "fast tiles\nimport os; os.makedirs('PWNED')\r# \x1b]52;c;x\x07"
    c, _agent = await session(tmp_path, task_dir, worker_pool, (NOISY, hostile))
    v = next(iter(v for v in c.state.versions.values() if v.origin == "agent"))
    assert "\x1b" not in v.summary and "\r" not in v.summary
    raw = (c.log.path / "events.jsonl").read_text()
    assert "\\u001b" not in raw and "\\r" not in raw  # nothing raw in the log either
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    replayed = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "replay", str(c.log.path),
                               "--headless"], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300)
    assert replayed.returncode == 0, replayed.stderr
    assert "\x1b" not in replayed.stdout and "\x07" not in replayed.stdout
    out = tmp_path / "exported.py"
    exported = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "export", str(c.log.path),
                               f"v{v.number}", "-o", str(out), "--test"],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=600)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    for path in (out, tmp_path / "test_exported.py"):
        text = path.read_text()
        assert "\r" not in text and "\x1b" not in text and "\x07" not in text
    assert "NOISY" in out.read_text()  # the kernel itself is all there
    # importing what was written runs no statement the summary smuggled in
    for module in ("exported", "test_exported"):
        subprocess.run([sys.executable, "-c", f"import {module}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert not (tmp_path / "PWNED").exists()
    # the workbench replays it in a real terminal: the source and the chat are shown, the
    # escapes are not sent
    drawn = "\u241b]52;c;".encode()  # the source's comment, its ESC drawn as a picture
    screen = _replayed_in_a_terminal(c.log.path, env, drawn)
    assert drawn in _without_csi(screen)  # styles may come between the picture and the rest
    for escape in (b"\x1b]52;", b"\x1bc", b"\x1b]0;pwned"):
        assert escape not in screen, escape


def _replayed_in_a_terminal(path: Path, env: dict[str, str], shown: bytes) -> bytes:
    """What ``tilewright replay PATH`` writes to a pseudo-terminal, from its first screen
    to its last event, once ``shown`` is on the screen (the panes may be drawn a frame
    after the status bar counts the last event)."""
    import re
    import time

    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(str(Path(sys.executable).parent / "tilewright"),
                          ["replay", str(path)],
                          # without pytest-xdist's COLUMNS=80/LINES=24: the pty's size rules
                          env={**{k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")},
                               "TERM": "xterm-256color"},
                          cwd=str(ROOT), dimensions=(40, 160), timeout=5)
    output = bytearray()

    def until(pattern: bytes, seconds: float) -> None:
        end = time.monotonic() + seconds
        while re.search(pattern, _without_csi(bytes(output))) is None:
            assert time.monotonic() < end and child.isalive(), (pattern,
                                                                 bytes(output[-2000:]))
            try:
                output.extend(child.read_nonblocking(1 << 16, timeout=0.2))
            except (pexpect.TIMEOUT, pexpect.EOF):
                pass

    try:
        until(rb"start of the session", 60)
        child.send("\x1b[F")  # End: the last event, its version's source on screen
        until(rb"event (\d+)/\1", 30)
        until(re.escape(shown), 90)
        child.send("q")
        end = time.monotonic() + 20
        while child.isalive() and time.monotonic() < end:
            try:
                output.extend(child.read_nonblocking(1 << 16, timeout=0.2))
            except (pexpect.TIMEOUT, pexpect.EOF):
                pass
    finally:
        child.close(force=True)
    return bytes(output)


def _without_csi(screen: bytes) -> bytes:
    """The screen's text with its control sequences (colours, cursor moves) removed: what
    a person reads. OSC and other escapes stay, so a smuggled one is still found."""
    import re

    return re.sub(rb"\x1b\[[0-9;?<>=$]*[ -/]*[@-~]", b"", screen)


def test_replay_verify_rejudges_each_version_on_its_own(tmp_path, task_dir) -> None:
    """A log whose honest-looking record came from an order-dependent judgement (an
    honest kernel after a poisoner, recorded wrong; a wrong kernel recorded right) is
    re-judged version by version, each in a process no other candidate ran in."""
    from tilewright.sessions.recorded.replay import verify  # noqa: F401  (the command is what is exercised)

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    wrong = candidate("x_ref[...] * 2.0")  # not tanh at all
    task = load_task(str(task_dir))
    log = SessionLog.create(tmp_path, task={"name": task.name, "root": str(task.root),
                                            "layout": task.layout},
                            backend=None, agent="scripted", app_version="test")
    # v1 the poisoner, v2 the wrong kernel, both recorded "correct" (forged by order)
    for n, (src, summary) in enumerate(((POISONER, "poisoner"), (wrong, "wrong")), start=1):
        pid = f"p{n}"
        log.append("agent.proposal", proposal=pid, kind="kernel", summary=summary,
                   rationale="", base_version=None, source_blob=log.put_blob(src), plan=None,
                   tuning=None, role="implement")
        decision = log.append("user.decision", proposal=pid, decision="approve", by="auto")
        log.append("kernel.version", version=n, parent=None, origin="agent", proposal=pid,
                   source_blob=log.put_blob(src), summary=summary,
                   decision_seq=decision["seq"])
        result = {"schema": "tilewright.eval/1", "status": "correct", "backend": None,
                  "correctness": {"correct": True}, "integrity": {"flags": []}}
        log.append("run.start", run=f"r{n}", version=n, kind="eval", by="auto")
        log.append("run.result", run=f"r{n}", version=n, status="correct", correct=True,
                   median_ms=None, result_blob=log.put_blob(json.dumps(result).encode()),
                   cancelled=False, flags=[])
    log.close()
    checked = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "replay", str(log.path),
                              "--verify"], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=900)
    assert checked.returncode != 0, checked.stdout
    lines = checked.stdout.splitlines()
    assert any(line.startswith("v2") and "incorrect" in line and "MISMATCH" in line
               for line in lines), checked.stdout
    state = fold(*(lambda s: (s.header, s.events))(load(log.path)))
    assert state.versions[2].status == "correct"  # the log is not rewritten


# Remembers every shape it is called with, and quotes them when profiled later in the same
# process (a profile follows an evaluation of the same source there).
REMEMBERS = candidate(preamble=textwrap.dedent("""
    import builtins
    _SEEN = builtins.__dict__.setdefault("_tw_seen", [])  # outlives a reload of the module
"""), expr="jnp.tanh(x_ref[...]) * 2.0").replace(
    "def kernel(x):\n",
    "def kernel(x):\n    _SEEN.append(tuple(x.shape))\n"
    "    if len(_SEEN) > 4:\n        raise ValueError(f'shapes seen so far: {_SEEN}')\n")


@ON_MODULE_LOOP
async def test_a_held_out_size_remembered_and_quoted_later_is_scrubbed(
        task_dir, worker_pool) -> None:
    from tilewright.kernels.judge.options import ProfileOptions

    task = load_task(str(task_dir))
    result = await worker_pool.evaluate(task, REMEMBERS, EvalOptions(trials=3, timeout_s=120.0,
                                                                     timing=False))
    profile = await worker_pool.profile(task, REMEMBERS, None, ProfileOptions(iters=1))
    told = json.dumps([result.error.__dict__ if result.error else None,
                       result.correctness, result.extra.get("shapes"), profile.get("error")],
                      default=str)
    assert "shapes seen so far" in told  # the failure is said ...
    # ... without the held-out rows (128, as a number of its own: a measured difference such as
    # 3.05128e-07 may hold the digits)
    assert not re.search(r"(?<![\d.])128(?!\d)", told.replace("<held-out size>", "")), told
