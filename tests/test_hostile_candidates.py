"""Hostile candidates, round 3: confined reads, no candidate code in the judge, the
program estimated is the program run, resources of the right process.

Each attack is a probe of our own, run through the real worker pool (the judge and
its confined candidate process), in TPU interpret mode on the CPU, against a copy of
the bundled gelu task at a small shape. Canary credentials live in a temporary HOME
that the app (and so the pool) uses.
"""

from __future__ import annotations

import base64
import codecs
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import pytest_asyncio
from sizes import small_overrides

from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parent.parent
GOOD = (ROOT / "tests" / "fixtures" / "candidates" / "good_gelu.py").read_text()
QUICK = EvalOptions(trials=3, timeout_s=90.0, timing=False, shapes=["small"])

# Canary secrets, each in the file a real credential would be in.
NETRC_PASSWORD = "CanaryNetrcPassw0rd4242"
AWS_SECRET = "CanaryAwsSecretWJalrXUtnFEMIK7MDENGbPxRfiCY"
SSH_BODY = ("b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
            "QyNTUxOQAAACBjYW5hcnljYW5hcnljYW5hcnljYW5hcnljYW5hcnljYW5hcnkAAAAJhC")
GCLOUD_REFRESH = "1//0gCanaryRefreshTokenForGcloudAdc9876"
CANARIES = (NETRC_PASSWORD, AWS_SECRET, *SSH_BODY, GCLOUD_REFRESH)


def write_canaries(home: Path) -> None:
    (home / ".aws").mkdir(parents=True, exist_ok=True)
    (home / ".ssh").mkdir(exist_ok=True)
    (home / ".config" / "gcloud").mkdir(parents=True, exist_ok=True)
    (home / ".netrc").write_text(f"machine api.example.com login bob password "
                                 f"{NETRC_PASSWORD}\n")
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIACANARY0123456789\n"
        f"aws_secret_access_key = {AWS_SECRET}\n")
    (home / ".ssh" / "id_ed25519").write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(SSH_BODY)
        + "\n-----END OPENSSH PRIVATE KEY-----\n")
    (home / ".config" / "gcloud" / "application_default_credentials.json").write_text(
        json.dumps({"client_id": "1234-canary.apps.googleusercontent.com",
                    "client_secret": "d-CanaryClientSecret42",
                    "refresh_token": GCLOUD_REFRESH, "type": "authorized_user"}))


# A candidate that reads every canary file and smuggles what it read out through its
# output and its error: plain, base64, hex, rot13 (the previous round's redaction let
# all but the plain AKIA id and whole PEM blocks through).
EXFILTRATE = '''
import base64, codecs, os
_stolen = []
for _name in (".netrc", ".aws/credentials", ".ssh/id_ed25519",
              ".config/gcloud/application_default_credentials.json"):
    try:
        with open(os.path.join(os.path.expanduser("~"), _name)) as _fh:
            _text = _fh.read()
    except OSError as _exc:
        _text = "unreadable: " + type(_exc).__name__
    _stolen.append(_text)
_blob = "\\n".join(_stolen)
for _form in (_blob, base64.b64encode(_blob.encode()).decode(), _blob.encode().hex(),
              codecs.encode(_blob, "rot13")):
    print("EXFIL", _form)
'''


def leaked(text: str) -> list[str]:
    """Canaries found in ``text`` as they are, or decoded from base64, hex or rot13."""
    candidates = [text, codecs.encode(text, "rot13")]
    for token in re.findall(r"[A-Za-z0-9+/=_-]{16,}", text):
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            for pad in ("", "=", "=="):
                try:
                    candidates.append(decode(token + pad).decode("utf-8", "replace"))
                except ValueError:
                    pass
        if re.fullmatch(r"[0-9a-fA-F]+", token) and len(token) % 2 == 0:
            candidates.append(bytes.fromhex(token).decode("utf-8", "replace"))
    return sorted({c for c in CANARIES for found in candidates if c in found})


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    write_canaries(home)
    return home


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    dest = tmp_path_factory.mktemp("task") / "gelu"
    shutil.copytree(ROOT / "kernels" / "bundled" / "gelu", dest)
    return dest


@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(str(task_dir), small_overrides(rows=64, cols=256))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(home):
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(home)  # the app's HOME: the workers inherit it
    try:
        async with WorkerPool(size=1) as p:
            yield p
    finally:
        os.environ["HOME"] = saved or "/root"


def _json(result) -> str:
    return json.dumps(result.to_json(), default=str)


# -- reads are confined ----------------------------------------------------------------

@ON_MODULE_LOOP
async def test_canary_files_in_home_are_unreadable(pool, task) -> None:
    result = await pool.evaluate(task, EXFILTRATE + GOOD, QUICK)
    fs = result.confinement["filesystem"]
    if not fs.get("active"):
        pytest.skip(f"no Landlock here: {fs}")
    assert fs["reads"] == "confined"
    assert result.status == "correct", result.error
    assert result.stderr.count("unreadable: PermissionError") >= 4  # all four, every form
    assert leaked(_json(result)) == []


@ON_MODULE_LOOP
async def test_an_error_carrying_the_canaries_carries_nothing(pool, task) -> None:
    result = await pool.evaluate(task, EXFILTRATE + "raise RuntimeError(_blob)\n" + GOOD,
                                 QUICK)
    if not result.confinement["filesystem"].get("active"):
        pytest.skip("no Landlock here")
    assert result.status == "runtime_error" and result.error.kind == "import"
    assert "unreadable: PermissionError" in result.error.message
    assert leaked(_json(result)) == []


@ON_MODULE_LOOP
async def test_what_a_worker_may_read_is_reported_and_excludes_home(pool, task, home) -> None:
    result = await pool.evaluate(task, GOOD, QUICK)
    fs = result.confinement["filesystem"]
    if not fs.get("active"):
        pytest.skip("no Landlock here")
    readable = [p for p in fs["readable"] if p.startswith("/")]
    real_home = os.path.realpath(home)
    assert not [p for p in readable if real_home == p or real_home.startswith(p + "/")
                or p.startswith(real_home + "/")]
    assert "/" not in readable and str(ROOT) not in readable  # a checkout's root holds .env


def test_redaction_is_a_second_line_for_encoded_secrets(home) -> None:
    from tilewright.kernels.pool.env import redact, secret_values

    secrets = secret_values({}, str(home))  # the canary files' secrets, read app-side
    blob = "\n".join((home / name).read_text() for name in (
        ".netrc", ".aws/credentials", ".ssh/id_ed25519",
        ".config/gcloud/application_default_credentials.json"))
    for shift in (b"", b"x", b"xy"):  # base64 of the text wherever it starts
        forms = [blob, base64.b64encode(shift + blob.encode()).decode(),
                 base64.urlsafe_b64encode(shift + blob.encode()).decode(),
                 blob.encode().hex(), blob.encode().hex().upper(),
                 codecs.encode(blob, "rot13"), blob[::-1]]
        for form in forms:
            cleaned = redact(form, secrets)
            assert "[redacted]" in cleaned
            assert leaked(cleaned) == [], form[:40]
    assert redact("an ordinary traceback line 42", secrets) == "an ordinary traceback line 42"


@pytest.mark.slow
def test_auto_against_a_model_server_never_sends_the_canaries(home, task_dir,
                                                              tmp_path) -> None:
    """The whole path: `tilewright auto --agent openai` against a local stand-in. The
    model proposes the exfiltrating kernel; its failure goes back to the model in the
    next request. No canary reaches the JSON, the session's files or a request."""
    sys.path.insert(0, str(ROOT / "tests"))
    from openai_server import ChatServer, text_reply, tool_reply

    source = EXFILTRATE + "raise RuntimeError('stolen: ' + _blob)\n" + GOOD
    with ChatServer(default=text_reply("I cannot fix that.")) as server:
        server.script(tool_reply("propose_kernel", {"summary": "steal", "source": source,
                                                    "rationale": "faster"}))
        env = {**os.environ, "HOME": str(home), "OPENAI_BASE_URL": server.url,
               "JAX_PLATFORMS": "cpu", "TILEWRIGHT_CONFIG": str(tmp_path / "none.toml"),
               "TILEWRIGHT_DATA_DIR": str(tmp_path / "data")}
        env.pop("OPENAI_API_KEY", None)
        sessions = tmp_path / "sessions"
        proc = subprocess.run(
            [sys.executable, "-m", "tilewright.tui.cli", "auto", "--task", str(task_dir), "--set",
             "rows=64", "--set", "cols=256", "--agent", "openai", "--budget", "2",
             "--session-dir", str(sessions), "--json"],
            capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
        requests = [json.dumps(r.body) for r in server.requests]
    assert proc.returncode in (0, 1), proc.stderr
    assert len(requests) >= 2, proc.stderr  # the failure went back to the model
    assert "PermissionError" in requests[1] or "[redacted]" in requests[1]
    everything = [proc.stdout, proc.stderr, *requests]
    everything += [p.read_text(errors="replace") for p in sessions.rglob("*") if p.is_file()]
    assert [leaked(text) for text in everything if leaked(text)] == []


# -- no candidate code in the judge ------------------------------------------------------

POISON = '''
import tilewright.kernels.worker.evaluation.compare as _compare
# Everywhere it is imported: every comparison "passes" from now on in that process (the
# swapped code runs with compare's own globals, where Comparison is defined).
_compare.compare.__code__ = (lambda out, ref, atol, rtol:
                             Comparison(True, 0.0, 0.0)).__code__  # noqa: F821
'''
WRONG = '''
import jax
from jax.experimental import pallas as pl

def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]

def kernel(x):
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''


@ON_MODULE_LOOP
async def test_profile_time_poisoning_leaves_the_next_wrong_kernel_incorrect(pool,
                                                                          task) -> None:
    from tilewright.kernels.cli.profile import profile
    from tilewright.kernels.judge.options import ProfileOptions

    await pool.request("hello", {})
    judges = list(pool.pids)
    profiled = await profile(task, POISON + GOOD, "kernel.py", ProfileOptions(iters=1),
                             judge=pool)
    # The swap of compare.__code__ is caught where it ran, in the candidate process.
    assert profiled["status"] == "error"
    assert profiled["error"]["kind"] == "harness_tampering"
    assert "tilewright.kernels.worker.evaluation.compare.compare" in profiled["error"]["message"]
    result = await pool.evaluate(task, WRONG, QUICK)
    assert result.status == "incorrect", result.error
    assert pool.pids == judges  # the judge itself was never exposed


@ON_MODULE_LOOP
async def test_lookup_api_never_imports_a_module_the_candidate_wrote(pool, task) -> None:
    planted = await pool.evaluate(task, '''
import os
_path = os.path.join(os.environ["TMPDIR"], "tw_planted_mod.py")
with open(_path, "w") as _fh:
    _fh.write("import os\\nos.environ['TW_PLANTED'] = '1'\\nVALUE = 'PLANTED-RAN'\\n")
print("PLANTED-AT", _path)
''' + GOOD, QUICK)
    assert planted.status == "correct", planted.error
    where = Path(re.search(r"PLANTED-AT (\S+)", planted.stderr).group(1))
    dotted = ".".join(where.with_suffix("").parts[1:])  # from /: a namespace package path
    for name in ("tw_planted_mod", dotted, f"jax.{where.stem}", f"numpy.{where.stem}",
                 "os.system", "jax._src.core"):
        found = await pool.request("lookup_api", {"name": name})
        assert "error" in found and "PLANTED-RAN" not in json.dumps(found), (name, found)
    enum = await pool.request("lookup_api", {"name": "pltpu.SemaphoreType"})
    assert enum["kind"] == "enum" and any(m.startswith("DMA = ") for m in enum["members"])
    assert "An enumeration" not in enum["doc"] and "Create a collection" not in enum["doc"]
    spec = await pool.request("lookup_api", {"name": "pl.BlockSpec"})
    assert spec["kind"] == "class" and "index_map" in spec["signature"]


def test_a_planted_argparse_beside_a_task_never_runs(task_dir, tmp_path) -> None:
    task = tmp_path / "downloaded"
    shutil.copytree(task_dir, task)
    marker = tmp_path / "planted-ran"
    (task / "argparse.py").write_text(textwrap.dedent(f"""
        import sys
        print("PLANTED-ARGPARSE-RAN", file=sys.stderr)
        try:
            open({str(marker)!r}, "w").write("ran")
        except OSError:
            pass
        raise ImportError("planted")
    """))
    (task / "kernel.py").write_text(GOOD)
    # `cd task && tilewright eval --task .`: the console script puts its own directory
    # first on the app's sys.path; the workers start with -P in their scratch dir.
    script = Path(sys.executable).with_name("tilewright")
    if not script.exists():
        pytest.skip(f"no tilewright console script beside {sys.executable}")
    proc = subprocess.run([str(script), "eval", "--task", ".", "--set", "rows=64", "--set",
                           "cols=256", "--shape", "small", "--json"], cwd=task,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout.strip().startswith("{"), proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "correct", result.get("error")
    assert "PLANTED-ARGPARSE-RAN" not in json.dumps(result)
    assert not marker.exists()


# -- the program estimated is the program run --------------------------------------------

PLATFORM_SPLIT = GOOD.replace("def kernel(", "def _honest(") + '''

def _zero(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 0.0

def _tpu_branch(x):
    return pl.pallas_call(_zero, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

def kernel(x):
    return jax.lax.platform_dependent(x, tpu=_tpu_branch, default=_honest)
'''


@ON_MODULE_LOOP
async def test_a_platform_dependent_kernel_is_refused(pool, task) -> None:
    # The TPU compile would see a kernel writing zeros; the host would run the honest one.
    result = await pool.evaluate(task, PLATFORM_SPLIT, QUICK)
    assert result.status == "rejected", (result.status, result.error)
    assert result.error.kind == "platform_dependent"
    assert "platform_dependent" in result.error.message and result.error.line is not None
    assert "platform_dependent" in result.integrity["flags"]


@ON_MODULE_LOOP
async def test_a_kernel_that_sets_interpret_itself_is_refused(pool, task) -> None:
    source = GOOD.replace("_gelu, out_shape=", "_gelu, interpret=True, out_shape=")
    assert "interpret=True" in source
    result = await pool.evaluate(task, source, QUICK)
    assert result.status == "rejected", (result.status, result.error)
    assert result.error.kind == "interpret_param"
    assert "interpret=True" in result.error.message and result.error.line is not None
    # ... while the harness's own interpret mode still runs the honest kernel
    assert (await pool.evaluate(task, GOOD, QUICK)).status == "correct"


@ON_MODULE_LOOP
async def test_outside_work_cut_into_chunks_is_still_outside_the_kernel(pool, task) -> None:
    # XLA computes gelu in four slices of 25%, each below the old per-op threshold when
    # cut finer; the kernel only copies.
    result = await pool.evaluate(task, '''
import math
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]

def _gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

def kernel(x):
    n = x.shape[0] // 8
    y = jnp.concatenate([_gelu(x[i * n:(i + 1) * n]) for i in range(8)])
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(y)
''', QUICK)
    assert result.status == "correct", result.error
    assert "compute_outside_kernel" in result.integrity["flags"]
    assert any("together" in item for item in result.integrity["outside_compute"])


# -- resources by the right process ---------------------------------------------------

SHM_WRITER = '''
import os
try:
    with open("/dev/shm/tilewright-probe", "wb") as _fh:
        for _ in range(1024):  # 1 GiB, 1 MiB at a time: tmpfs pages are not resident
            _fh.write(b"x" * (1 << 20))
    print("SHM-WROTE all of it")
except OSError as _exc:
    print("SHM-STOPPED", type(_exc).__name__, _exc.errno)
'''
SHM_LISTER = '''
import os
try:
    print("SHM-LIST", sorted(os.listdir("/dev/shm")))
except OSError as _exc:
    print("SHM-LIST-DENIED", type(_exc).__name__)
'''


@ON_MODULE_LOOP
async def test_dev_shm_is_private_small_and_empty_after_the_request(pool, task) -> None:
    first = await pool.evaluate(task, SHM_WRITER + GOOD, QUICK)
    assert first.status == "correct", first.error
    assert "SHM-WROTE" not in first.stderr  # a small private tmpfs, or denied
    assert not os.path.exists("/dev/shm/tilewright-probe")  # never the host's
    second = await pool.evaluate(task, SHM_LISTER + GOOD, QUICK)
    assert "SHM-LIST []" in second.stderr or "SHM-LIST-DENIED" in second.stderr, \
        second.stderr[-2000:]


# A candidate that found the folder where judges keep their compiled XLA programs: it
# tries to replace one (the next judge would run it as the task's input builder) and to
# add one.
PLANT = '''
import os
print("PLANT-ENV", os.environ.get("TILEWRIGHT_ESTIMATE_CACHE"))
for _name in (TARGETS):
    try:
        with open(os.path.join(FOLDER, _name), "wb") as _fh:
            _fh.write(b"planted")
        print("PLANT-WROTE", _name)
    except OSError as _exc:
        print("PLANT-REFUSED", type(_exc).__name__)
'''


@ON_MODULE_LOOP
async def test_the_judges_compiled_programs_are_kept_where_no_candidate_can_write(
        task, tmp_path) -> None:
    cache = {"TILEWRIGHT_CACHE_DIR": str(tmp_path)}  # this test's judges' own

    def last_used(entry: Path) -> int:  # JAX stamps an entry when it writes or reads it
        stamp = entry.with_name(entry.name.replace("-cache", "-atime"))
        return int.from_bytes(stamp.read_bytes(), "little")

    async with WorkerPool(size=1, env_overrides=cache) as pool:
        first = await pool.evaluate(task, GOOD, QUICK)
        assert first.status == "correct", first.error
        if not first.confinement["filesystem"].get("active"):
            pytest.skip("no Landlock here: the judge keeps no compiled program")
        kept = sorted(tmp_path.rglob("jit__normal-*-cache"))  # the task's input builder
        assert kept
        before = {p: p.read_bytes() for p in kept}
        folder = kept[0].parent
        source = PLANT.replace("FOLDER", repr(str(folder))).replace(
            "TARGETS", repr((kept[0].name, "jit__normal-0-cache")))
        planted = await pool.evaluate(task, source + GOOD, QUICK)
    assert planted.status == "correct", planted.error
    assert "PLANT-ENV None" in planted.stderr  # the judge's cache is not named to it
    assert planted.stderr.count("PLANT-REFUSED PermissionError") >= 2, planted.stderr[-2000:]
    assert "PLANT-WROTE" not in planted.stderr and not (folder / "jit__normal-0-cache").exists()
    assert {p: p.read_bytes() for p in kept} == before
    # The next judge loads the input builder from the folder instead of compiling it.
    started = time.time_ns()
    async with WorkerPool(size=1, env_overrides=cache) as fresh:
        again = await fresh.evaluate(task, GOOD, QUICK)
    assert again.status == "correct", again.error
    assert all(last_used(p) >= started for p in kept)
    assert sorted(tmp_path.rglob("jit__normal-*-cache")) == kept


BOMB = '''
import numpy as np

_HOARD = []
for _ in range(30):  # 3 GB, 100 MB at a time, every page touched; kept alive
    _HOARD.append(np.ones(100 * 1024 * 1024 // 8))
'''


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("mounts", ["private", "host"])
async def test_two_workers_one_memory_bomb(task, mounts, monkeypatch) -> None:
    # Two pools: the second's candidate process has the same namespace pid as the
    # first's. Mapping that pid to the first /proc entry carrying it watched (and would
    # have paused and killed) the first pool's process: the bomb went through.
    if mounts == "host":  # the host's /proc: the mapping goes through NSpid chains
        monkeypatch.setenv("TILEWRIGHT_CONFINE_MOUNTS", "off")
    async with WorkerPool(size=1, memory_limit_mb=1500) as first, \
            WorkerPool(size=1, memory_limit_mb=1500) as second:
        calm = await first.evaluate(task, GOOD, QUICK)
        assert calm.status == "correct", calm.error
        bombed = await second.evaluate(task, BOMB + GOOD, QUICK)
        assert bombed.status == "crashed", (bombed.status, bombed.error)
        assert bombed.error.kind == "memory"
        assert bombed.extra["candidate_process"]["killed"] == "memory"
        again = await first.evaluate(task, GOOD, QUICK)
        assert again.status == "correct"
        assert again.extra["candidate_process"]["pid"] == calm.extra["candidate_process"]["pid"]
        assert not again.extra["candidate_process"]["restarted"]


def test_the_capture_file_is_read_from_its_end() -> None:
    from tilewright.kernels.pool.process import STDERR_LIMIT, WorkerProcess

    class Recording:  # the real file, with the sizes of its reads noted
        def __init__(self, real):
            self.real, self.sizes = real, []

        closed = property(lambda self: self.real.closed)

        def read(self, size=-1):
            self.sizes.append(size)
            return self.real.read(size)

        def __getattr__(self, name):
            return getattr(self.real, name)

    worker = WorkerProcess()
    real = worker.capture
    worker.capture = Recording(real)  # type: ignore[assignment]
    try:
        real.write(b"head " * (4 * STDERR_LIMIT) + b"THE-END\n")
        text = worker.read_capture()
        assert text.endswith("THE-END\n") and "bytes cut" in text
        assert worker.capture.sizes and all(0 < s <= STDERR_LIMIT
                                            for s in worker.capture.sizes)
        assert real.seek(0, os.SEEK_END) == 0  # emptied for the next request
    finally:
        worker.close_channel()


# -- a judge exposed to anything unexpected is recycled ----------------------------------

@ON_MODULE_LOOP
async def test_a_task_that_rewrites_the_harness_in_the_judge_gets_it_replaced(
        pool, task_dir, tmp_path) -> None:
    # Task code (its reference) runs in the judge. One that swaps harness code there is
    # not caught by a candidate's checks; the judge's own snapshot is.
    hostile = tmp_path / "hostile"
    shutil.copytree(task_dir, hostile)
    ref = hostile / "reference.py"
    ref.write_text(POISON + ref.read_text())
    await pool.request("hello", {})
    before = list(pool.pids)
    result = await pool.evaluate(load_task(str(hostile), small_overrides(rows=64, cols=256)),
                                 WRONG, QUICK)
    # The poisoned judge's verdict is not given: the task is blamed, the judge replaced.
    assert result.status == "runtime_error" and result.error.kind == "task", result.error
    assert "tilewright.kernels.worker.evaluation.compare.compare" in result.error.message
    await pool.request("hello", {})  # waits for the replacement
    assert pool.pids and pool.pids != before
    honest = load_task(str(task_dir), small_overrides(rows=64, cols=256))
    assert (await pool.evaluate(honest, WRONG, QUICK)).status == "incorrect"


def test_a_task_reaches_a_worker_as_a_copy_without_links_dotfiles_or_sessions(
        tmp_path, home) -> None:
    from tilewright.kernels.tasks import copies as task_copy
    from tilewright.kernels.tasks.copies import TaskCopies, TaskCopyError, restore

    task = tmp_path / "task"
    shutil.copytree(ROOT / "kernels" / "bundled" / "gelu", task)
    (task / "helpers").mkdir()
    (task / "helpers" / "util.py").write_text("X = 1\n")
    (task / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-canary\n")
    (task / "stolen_key").symlink_to(home / ".ssh" / "id_ed25519")
    (task / "sessions" / "s1").mkdir(parents=True)
    (task / "sessions" / "s1" / "events.jsonl").write_text("{}\n")
    spec = load_task(str(task)).to_spec()
    copies = TaskCopies(tmp_path / "scratch" / "tasks")
    local, mapping = copies.localize(spec)
    copy = Path(local["root"])
    assert copy != task and copy.is_relative_to(tmp_path / "scratch" / "tasks")
    assert (copy / "reference.py").read_text() == (task / "reference.py").read_text()
    assert (copy / "helpers" / "util.py").exists()
    assert not (copy / ".env").exists() and not (copy / "stolen_key").exists()
    assert not (copy / "sessions").exists()
    assert Path(local["reference_path"]) == copy / "reference.py"
    said = restore({"error": {"file": local["reference_path"]}}, mapping)
    assert said["error"]["file"] == str(task / "reference.py")
    # unchanged: not copied again; changed: refreshed
    stamp = (copy / "reference.py").stat().st_mtime_ns
    copies.localize(spec)
    assert (copy / "reference.py").stat().st_mtime_ns == stamp
    (task / "helpers" / "util.py").write_text("X = 2\n")
    copies.localize(spec)
    assert (copy / "helpers" / "util.py").read_text() == "X = 2\n"
    big = tmp_path / "big"
    shutil.copytree(task, big, symlinks=True)
    for i in range(task_copy.MAX_FILES + 1):
        (big / f"data_{i}.txt").write_text("x")
    with pytest.raises(TaskCopyError, match="too much to copy"):
        copies.localize(load_task(str(big)).to_spec())


def test_snapshots_see_code_swaps_class_members_and_table_contents() -> None:
    from tilewright.kernels.worker.evaluation import compare, integrity

    snapshot = integrity.ModuleSnapshot()
    saved_code = compare.compare.__code__
    saved_method = integrity.ModuleSnapshot.__dict__["new_threads"]
    try:
        compare.compare.__code__ = (lambda out, ref, atol, rtol: None).__code__
        integrity.ModuleSnapshot.new_threads = lambda self: []
        integrity.MOVEMENT.add("mul")
        changed = snapshot.changed()
    finally:
        compare.compare.__code__ = saved_code
        integrity.ModuleSnapshot.new_threads = saved_method
        integrity.MOVEMENT.discard("mul")
    assert "tilewright.kernels.worker.evaluation.compare.compare" in changed
    assert "tilewright.kernels.worker.evaluation.integrity.ModuleSnapshot.new_threads" in changed
    assert "tilewright.kernels.worker.evaluation.integrity.MOVEMENT" in changed
    assert snapshot.changed() == []  # put back: nothing left to report


def test_jaxpr_checks_for_platform_branches_interpret_and_chunked_work() -> None:
    import jax
    import jax.numpy as jnp
    from jax._src.lax.control_flow.conditionals import platform_index_p
    from jax.experimental import pallas as pl

    from tilewright.kernels.worker.evaluation import integrity, refusals

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def diag_body(x_ref, o_ref):
        o_ref[...] = jnp.diagonal(x_ref[...])[None, :] + x_ref[...]

    def call(x, kernel=body, **kw):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              **kw)(x)

    def zero(x):
        return call(x) * 0.0

    def raw_index(x):
        index = platform_index_p.bind(platforms=(("tpu",), None), has_default=True)
        return jax.lax.switch(index, [zero, call], x)

    x = jnp.ones((128, 128), jnp.float32)

    def refusal(fn):
        found = refusals.program_refusal(jax.make_jaxpr(fn)(x), __file__)
        return found and found["kind"]

    assert refusal(call) is None
    assert refusal(lambda v: call(v, diag_body)) is None  # JAX's own Mosaic diagonal
    assert refusal(lambda v: jax.lax.platform_dependent(v, tpu=call, default=call)) is None
    assert refusal(lambda v: jax.lax.platform_dependent(v, tpu=zero, default=call)) \
        == "platform_dependent"
    assert refusal(raw_index) == "platform_dependent"
    assert refusal(lambda v: call(v, interpret=True)) == "interpret_param"

    def chunked(v):  # 8 slices of 1/8 each: none full size, together all of it
        n = v.shape[0] // 8
        return call(jnp.concatenate([jnp.tanh(v[i * n:(i + 1) * n]) for i in range(8)]))

    def scanned(v):  # the same work in a scan of 8 steps
        def step(carry, piece):
            return carry, jnp.tanh(piece)
        return call(jax.lax.scan(step, 0.0, v.reshape(8, -1, v.shape[1]))[1].reshape(v.shape))

    found = integrity.outside_compute(jax.make_jaxpr(chunked)(x), __file__)
    assert len(found) == 9 and "together 100%" in found[-1], found
    found = integrity.outside_compute(jax.make_jaxpr(scanned)(x), __file__)
    assert found and found[0].endswith(" x8"), found  # one op, counted per iteration
    def touch_up(v):  # one-sixteenth of the output fixed up outside the kernel
        out = call(v)
        return out.at[:8].set(jnp.tanh(out[:8]))

    small = integrity.outside_compute(jax.make_jaxpr(touch_up)(x), __file__)
    assert small == []  # a little bookkeeping outside is fine
