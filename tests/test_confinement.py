"""Hostile candidates against the worker's confinement (kernels.confinement).

Each probe is a correct gelu kernel that also attacks at import time, run through the
real worker pool on a copy of the gelu task. Every test asserts that the attack failed
and that the evaluation still reports a sensible result. Where a layer is unavailable
on the host (no user namespaces, no Landlock) the test says so by skipping that part.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import textwrap
from pathlib import Path

import pytest
import pytest_asyncio
from sizes import load_small

from tilewright.agents.prompts.context import MAX_TURN_CHARS, bounded
from tilewright.kernels.cli import task_and_candidate
from tilewright.kernels.pool.env import redact, secret_values, worker_environment
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.source.files import KERNEL_SIZE_LIMIT, KernelFileError, read_kernel_file
from tilewright.kernels.tasks.loaders import load_task

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parent.parent
GOOD = (ROOT / "tests" / "fixtures" / "candidates" / "good_gelu.py").read_text()
QUICK = EvalOptions(trials=3, timeout_s=60.0, timing=False, shapes=["small"])
# Secrets the app holds; none may reach a candidate or come back from one.
API_KEY = "sk-ant-api03-confinementtestkey0123456789"
DB_PASSWORD = "s3cret-db-pass-4242"
SECRETS = {"ANTHROPIC_API_KEY": API_KEY, "DATABASE_URL": f"postgres://app:{DB_PASSWORD}@db/x",
           "MY_SERVICE_CONN": "opaque-value-without-a-marker"}


def probe(attack: str) -> str:
    """A correct kernel whose module runs ``attack`` first."""
    return textwrap.dedent(attack) + "\n\n" + GOOD


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """A private copy of gelu: a failed confinement must not poison the bundled task."""
    dest = tmp_path_factory.mktemp("task") / "gelu"
    shutil.copytree(ROOT / "kernels" / "bundled" / "gelu", dest)
    return dest


@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(str(task_dir), {"rows": "64", "cols": "256"})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(home):
    saved = dict(os.environ)
    os.environ.update(SECRETS)
    os.environ["HOME"] = str(home)
    (home / ".netrc").write_text(f"machine db login app password {DB_PASSWORD}\n")
    try:
        async with WorkerPool(size=1) as p:
            yield p
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _text(result) -> str:
    return json.dumps(result.to_json(), default=str)


async def run(pool, task, attack: str):
    result = await pool.evaluate(task, probe(attack), QUICK)
    assert result.status == "correct", (result.error, result.stderr[-2000:])
    for value in (API_KEY, DB_PASSWORD, SECRETS["MY_SERVICE_CONN"]):
        assert value not in _text(result)
    return result


@ON_MODULE_LOOP
async def test_the_report_says_what_confines_the_worker(pool, task) -> None:
    result = await run(pool, task, "pass")
    conf = result.confinement
    assert conf["app"] == "non-dumpable"
    assert conf["level"] in ("strong", "partial", "minimal") and conf["summary"]
    assert conf["processes"]["core"] == 0 and conf["processes"]["file_size_bytes"] > 0
    for layer in ("namespaces", "filesystem"):  # active, or says why not
        assert conf[layer].get("active") or conf[layer].get("reason")


@ON_MODULE_LOOP
async def test_the_app_environment_cannot_be_read_through_proc(pool, task) -> None:
    result = await run(pool, task, """
        import os
        found = []
        for pid in [os.getppid()] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            for name in ("environ", "mem"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as fh:
                        data = fh.read(1 << 20)
                    found.append(data.decode(errors="replace"))
                except OSError:
                    pass
        text = "\\n".join(found)
        print("LEAK:" + text[:200000])
        print("ENV:" + repr(dict(os.environ)))
    """)
    assert "LEAK:" in result.stderr and "ENV:" in result.stderr  # it ran, found nothing
    assert "DATABASE_URL" not in result.stderr and "MY_SERVICE_CONN" not in result.stderr


@ON_MODULE_LOOP
async def test_a_secret_file_in_home_cannot_be_read(pool, task) -> None:
    # Landlock confines reads: the user's ~/.netrc is not among what a worker may read.
    result = await pool.evaluate(task, probe("""
        import os
        secret = open(os.path.expanduser("~/.netrc")).read()
        print("NETRC:", secret)
        raise RuntimeError("leaking " + secret)
    """), QUICK)
    if not result.confinement["filesystem"].get("active"):
        pytest.skip(f"no Landlock here: {result.confinement['filesystem']}")
    assert result.status == "runtime_error" and result.error.kind == "import"
    assert "PermissionError" in result.error.message and "leaking" not in result.error.message
    assert "NETRC:" not in result.stderr
    assert DB_PASSWORD not in _text(result)


@ON_MODULE_LOOP
async def test_setsid_and_double_forked_children_die_with_the_evaluation(pool, task) -> None:
    result = await run(pool, task, """
        import os, time
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode() + b"\\n")
                while True:
                    time.sleep(0.1)  # heartbeat loop
            os._exit(0)
        print("ESCAPED-PID", int(os.read(r, 64).decode().split()[0]))
        open("/proc/self/stat").read()
    """)
    assert "ESCAPED-PID" in result.stderr
    assert "spawned_processes" in result.integrity["flags"]
    assert result.extra["leftover_processes"] >= 1
    # The printed pid is namespace-local when a PID namespace is active; either way no
    # process of the pool's tree may be left but the worker itself.
    from tilewright.kernels.confinement import descendants

    for worker in pool._workers.values():
        left = [p for p in descendants(worker.proc.pid) if p != worker.pid]
        assert all(not _alive(p) for p in left if p not in _worker_chain(worker))


def _worker_chain(worker) -> set[int]:
    """The shim, the namespace's init and the serving process."""
    from tilewright.kernels.confinement import descendants

    chain = {worker.proc.pid, worker.pid}
    for pid in descendants(worker.proc.pid):
        if worker.pid in descendants(pid) or pid == worker.pid:
            chain.add(pid)
    # The judge's zygote (kernels.worker.zygote) and its forks: the warm
    # candidate process (with a shim and an init when it makes namespaces of its own;
    # anything a candidate leaves is below its server, which reaps it after each
    # request) and the TPU compile processes (kernels.worker.tpu.compiler).
    level = set(chain)
    for _ in range(4):
        level = {p for p, parent in _parents().items() if parent in level} - chain
        chain |= {p for p in level if _is_judge_helper(p)}
        level &= chain
    return chain


def _parents() -> dict[int, int]:
    from tilewright.kernels.confinement import _process_table

    return _process_table()


def _is_judge_helper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as fh:  # a fork of the zygote (forked from the judge)
            if fh.read().strip() in ("tw-zygote", "tw-candidate", "tw-compiler"):
                return True
        with open(f"/proc/{pid}/cmdline", "rb") as fh:  # one started as a process of its own
            cmdline = fh.read()
            return any(module in cmdline for module in (
                b"tilewright.kernels.worker.candidate.main",
                b"tilewright.kernels.worker.zygote",
                b"tilewright.kernels.worker.tpu.compiler"))
    except OSError:
        return False


@ON_MODULE_LOOP
async def test_three_hundred_children_are_refused_or_reaped(pool, task) -> None:
    result = await run(pool, task, """
        import os, time
        made = 0
        for _ in range(300):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)  # the payload: forked children that outlive the candidate
                os._exit(0)
            made += 1
        print("FORKED", made)
    """)
    made = int(re.search(r"FORKED (\d+)", result.stderr).group(1))
    nproc = result.confinement["processes"]["nproc"]
    if nproc is None:  # uid 0: the kernel does not count; the reaper must have got them
        assert made == 300
    assert result.extra.get("leftover_processes", 0) >= min(made, 1)
    for worker in pool._workers.values():
        chain = _worker_chain(worker)
        from tilewright.kernels.confinement import descendants

        assert [p for p in descendants(worker.proc.pid) if p not in chain and _alive(p)] == []


@ON_MODULE_LOOP
async def test_writes_to_home_and_the_task_are_refused(pool, task, task_dir, home) -> None:
    reference = task_dir / "reference.py"
    before = reference.read_text()
    result = await pool.evaluate(task, probe(f"""
        import os
        outcome = []
        for path in ({str(reference)!r}, {str(home / "pwned")!r}, {str(task_dir / "new.py")!r}):
            try:
                with open(path, "a") as fh:
                    fh.write("poison = 1\\n")
                outcome.append("WROTE " + path)
            except OSError as exc:
                outcome.append("DENIED " + path + " " + type(exc).__name__)
        scratch = os.environ["TMPDIR"]
        with open(os.path.join(scratch, "ok.txt"), "w") as fh:
            fh.write("scratch is writable")
        print("\\n".join(outcome))
    """), QUICK)
    if not result.confinement["filesystem"].get("active"):
        pytest.skip(f"no read-only filesystem here: {result.confinement['filesystem']}")
    assert result.status == "correct", result.error
    # The module runs once per runtime (the check shapes', the production shape's).
    denied = {line for line in result.stderr.splitlines() if line.startswith("DENIED")}
    assert "WROTE" not in result.stderr and len(denied) == 3, result.stderr
    assert reference.read_text() == before
    assert not (home / "pwned").exists() and not (task_dir / "new.py").exists()


@ON_MODULE_LOOP
async def test_a_listener_cannot_be_reached_and_nothing_connects_out(pool, task) -> None:
    result = await run(pool, task, """
        import socket
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", 0))
            s.listen()
            print("LISTENING", s.getsockname()[1])
            _keep = s
        except OSError as exc:
            print("BIND-DENIED", exc)
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=1).close()
            print("CONNECTED-OUT")
        except OSError as exc:
            print("CONNECT-DENIED", exc)
    """)
    net = result.confinement["network"]
    if not net.get("isolated") and "denied" not in net.get("how", ""):
        pytest.skip(f"no network confinement here: {net}")
    assert "CONNECTED-OUT" not in result.stderr
    port = re.search(r"LISTENING (\d+)", result.stderr)
    if port:  # bound inside a private network namespace: unreachable from here
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(port.group(1))), timeout=1).close()
    else:
        assert "BIND-DENIED" in result.stderr


@ON_MODULE_LOOP
async def test_a_reference_that_hangs_is_the_tasks_fault(tmp_path) -> None:
    task_dir = tmp_path / "slow"
    shutil.copytree(ROOT / "kernels" / "bundled" / "gelu", task_dir)
    ref = task_dir / "reference.py"
    ref.write_text(ref.read_text().replace("def reference(", "def _reference(") + textwrap.dedent("""

        def reference(*args):
            import time
            while True:
                time.sleep(0.05)  # the payload: a reference that never returns
    """))
    slow = load_task(str(task_dir), {"rows": "64", "cols": "256"})
    async with WorkerPool(size=1) as pool:
        result = await pool.evaluate(slow, GOOD, EvalOptions(trials=3, timeout_s=4.0,
                                                             timing=False, shapes=["small"]))
        assert result.status == "timeout"
        assert result.error.kind == "task", result.error
        assert "not the kernel's" in result.error.message
        assert result.extra["reference_probe"] == "exceeds"
        # how far the judge got before it was killed: its finished phases, by progress
        assert result.extra["last_phase"]["phase"] == "runtime_s"
        assert "reference_s" not in result.extra["phases"]
        # ... whereas a kernel that hangs on a sound task is the kernel's fault
        hang = probe("while True:\n    pass\n")
        task = load_small("gelu", rows=64, cols=256)
        kernel_fault = await pool.evaluate(task, hang, EvalOptions(
            trials=3, timeout_s=4.0, timing=False, shapes=["small"]))
        assert kernel_fault.status == "timeout" and kernel_fault.error.kind == "timeout"
        assert kernel_fault.extra["reference_probe"] == "fits"


def test_the_worker_environment_is_an_allowlist_scrubbed_by_value() -> None:
    base = {**SECRETS, "PATH": "/usr/bin", "HOME": "/home/u", "JAX_PLATFORMS": "tpu",
            "LIBTPU_INIT_ARGS": "--xla_tpu_flag=1", "TPU_VISIBLE_CHIPS": "0",
            "XLA_FLAGS": "--xla_dump_to=/tmp/x", "HTTP_PROXY_URL": "http://u:pw12345678@proxy",
            "PYTHONPATH": "/src", "weird name": "x", "GH": "ghp_" + "a" * 36}
    env = worker_environment(base)
    for kept in ("PATH", "HOME", "JAX_PLATFORMS", "LIBTPU_INIT_ARGS", "TPU_VISIBLE_CHIPS",
                 "XLA_FLAGS"):
        assert env[kept] == base[kept]
    for dropped in (*SECRETS, "HTTP_PROXY_URL", "weird name", "GH"):
        assert dropped not in env
    secrets = secret_values(base)
    assert DB_PASSWORD in secrets and API_KEY in secrets
    text = redact(f"url postgres://app:{DB_PASSWORD}@db key {API_KEY} pw {DB_PASSWORD}",
                  secrets)
    assert DB_PASSWORD not in text and API_KEY not in text and "[redacted]" in text


def test_kernel_files_that_leave_the_task_or_are_huge_are_refused(tmp_path) -> None:
    task_dir = tmp_path / "t"
    shutil.copytree(ROOT / "kernels" / "bundled" / "gelu", task_dir)
    (task_dir / "kernel.py").unlink()
    (task_dir / "kernel.py").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="symlink to /etc/passwd, outside"):
        task_and_candidate(str(task_dir), None, None)
    big = tmp_path / "big.py"
    big.write_text("# x\n" * (KERNEL_SIZE_LIMIT // 4 + 10))
    with pytest.raises(KernelFileError, match="at most"):
        read_kernel_file(big)
    inside = task_dir / "k2.py"
    inside.write_text(GOOD)
    (task_dir / "link.py").symlink_to(inside)
    assert read_kernel_file(task_dir / "link.py", (task_dir,)) == GOOD


def test_requests_to_a_model_are_bounded() -> None:
    from tilewright import agents
    from tilewright.agents.base import AgentRequest
    from tilewright.agents.prompts.context import turn_text

    huge = "x = 1\n" * 5_000_000  # a 30 MB "kernel"
    error = {"status": "runtime_error", "error": {"kind": "runtime", "message": "E" * 10**6,
                                                  "traceback": "T\n" * 10**6}}
    request = AgentRequest("fix", agents.brief(load_task("gelu")), huge, 2, last_eval=error)
    text = turn_text(request)
    assert len(text) <= MAX_TURN_CHARS + 100
    assert "characters cut" in text
    assert len(bounded(huge, 1000)) < 1100
    # Nothing in the app parses a source that size (CPython's parser took over a minute
    # on it, on the event loop the UI shares): the tunables view and the reply check
    # refuse it with the reason.
    from tilewright.agents.prompts.parsing import check_kernel_source
    from tilewright.kernels.source import tunables

    with pytest.raises(tunables.TunablesError, match="too large"):
        tunables.read(huge)
    assert "at most" in (check_kernel_source(huge, "kernel", True) or "")


def test_a_timeout_says_how_far_the_judge_got() -> None:
    """The words a worker killed at its deadline carries (on the v5e a gelu eval at
    8192x8192 ran past 120 s and said nothing of where)."""
    from tilewright.kernels.pool.process import how_far

    assert how_far(None) == "it had reported no finished phase"
    words = how_far({"phase": "trials_s", "shape": "tpu_8k", "at_s": 97.5,
                     "phases": {"reference_s": 12.0, "trials_s": 80.25}})
    assert words == ("its last finished phase was trials at the check shape tpu_8k, 97.5 s "
                     "in (so far: reference 12 s, trials 80.25 s)")
