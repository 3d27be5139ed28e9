"""The real TPU compiler, in a worker: compile verdicts and static cycle estimates.

On a host without a TPU, libtpu still compiles for an *abstract* TPU topology
(``jax.experimental.topologies.get_topology_desc``): the candidate is lowered with
arguments placed on a device of that topology and compiled by the same compiler a TPU
VM runs, Mosaic included. That catches what lowering alone cannot (scoped-VMEM
overflow, Mosaic's refusals, generation limits) and, when libtpu is started with
``--xla_jf_dump_static_llo_profile_to=DIR``, the compiler writes its own static cycle
estimate per HLO op into DIR. The estimate of the candidate against the estimate of
the XLA reference compiled for the same chip and shapes is the *estimated speedup*:
the number that ranks kernels off-TPU (``kernels.judge.rank.ranking``).

Facts this module is built around (measured with jax 0.10.2 and libtpu 0.0.42):
- libtpu reads ``LIBTPU_INIT_ARGS`` once, when it loads: ``prepare_environment`` sets
  the dump flag (and a per-process dump directory) before JAX is imported.
- An unknown flag kills the process at start-up, so the flag is only set when the
  libtpu binary contains its name. The flag is undocumented: anything missing
  degrades to ``estimate: null`` with a reason, never to a crash.
- With the flag, compiling for v4 aborts the whole process (the estimator's DMA model
  knows v5e/v5p/v6e only) and a v7x compile fails an internal check of the estimator
  (``profiling.chips.ESTIMATOR_REFUSALS``): such a compile in a worker with estimates
  on is refused as ``unavailable`` instead of being attempted.
- The estimator recurses deeply: compiles run on one thread with a large stack.
- Files from successive compiles accumulate in the one directory (named per op, a
  later op of the same name overwrites): it is emptied before each compile and read
  after it, under a lock, one compile at a time.
- Lowering on the CPU backend asks the CPU device what TPU it is (integer ``//`` in a
  kernel body does): ``abstract_device(chip)`` answers with the chosen TPU instead,
  so a valid kernel is never refused by a host artifact.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import importlib.util
import mmap
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tilewright.profiling.chips import estimator_refusal

# Abstract topologies libtpu accepts for each chip of the table (smallest that worked).
TOPOLOGIES = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2",
              "v7x": "tpu7x:2x2x1"}
# Chips whose compile survives the estimate flag (``profiling.chips.ESTIMATOR_REFUSALS``
# says why the others do not: v4 aborts the process, v7x fails a check in the estimator).
ESTIMATE_CHIPS = tuple(c for c in TOPOLOGIES if estimator_refusal(c) is None)
FLAG = "--xla_jf_dump_static_llo_profile_to"
DISABLE_ENV = "TILEWRIGHT_TPU_ESTIMATE"  # "0": start libtpu without the estimate flag
DUMP_ENV = "TILEWRIGHT_LLO_DUMP_DIR"  # where this process's libtpu writes estimates
STATE_ENV = "TILEWRIGHT_LIBTPU"  # why estimates are (un)available, set at start-up
SOURCE = "tpu_compiler_static_estimate"

_SCOPED = re.compile(r'used_scoped_memory_configs\\?"\s*:\s*\[(.*?)\]')
_SIZE = re.compile(r'size\\?"\s*:\s*\\?"?(\d+)')
_LOCK = threading.Lock()  # one compile at a time: the dump directory is shared
_EXECUTOR: ThreadPoolExecutor | None = None
_TARGETS: dict[str, Any] = {}


# -- start-up (before JAX is imported) ----------------------------------------------

def libtpu_path() -> str | None:
    """The libtpu shared library of this environment, without importing it."""
    try:
        spec = importlib.util.find_spec("libtpu")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "libtpu.so")
    return path if os.path.exists(path) else None


def flag_supported(path: str) -> bool:
    """Whether this libtpu knows the estimate flag (an unknown flag kills the process)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(FLAG[2:].encode()) >= 0
    except (OSError, ValueError):
        return False


def on_tpu_host(environ: dict[str, str] | os._Environ[str]) -> bool:
    platforms = environ.get("JAX_PLATFORMS", "")
    if platforms and "tpu" not in platforms.lower():
        return False
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def prepare_environment(environ: dict[str, str] | os._Environ[str] | None = None,
                        dump_parent: str | None = None, estimates: bool = True) -> str:
    """Set up libtpu for this process before JAX loads it; returns the state (also left
    in ``TILEWRIGHT_LIBTPU``): ``estimates`` when the flag is set, else why not
    (``no_libtpu``, ``disabled``, ``flag_missing``, ``not_here``). Only the judge's
    estimator processes (``kernels.worker.tpu.compiler``) ask for estimates: with the flag
    every compile of the process pays for the estimator. The dump directory this
    creates is removed when the process exits."""
    env = os.environ if environ is None else environ
    path = libtpu_path()
    if path is None:
        state = "no_libtpu"
    else:
        if not on_tpu_host(env):
            # An abstract topology needs no TPU; these keep libtpu from probing for one
            # (and from printing about it) when it loads.
            env.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
            env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
            # No chip to share: without this, a second worker (or any other process
            # with libtpu loaded) gets "The TPU is already in use by another process".
            env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        if not estimates:
            state = "not_here"  # (children still see the user's own setting)
        elif env.get(DISABLE_ENV, "1") == "0":
            state = "disabled"
        elif FLAG in env.get("LIBTPU_INIT_ARGS", ""):
            state = "estimates"  # someone set it already: use theirs
            match = re.search(re.escape(FLAG) + r"=(\S+)", env["LIBTPU_INIT_ARGS"])
            if match:
                env[DUMP_ENV] = match.group(1)
        elif not flag_supported(path):
            state = "flag_missing"
        else:
            dump = tempfile.mkdtemp(prefix="tilewright-llo-", dir=dump_parent)
            if environ is None:  # this process's own: gone when it ends
                atexit.register(shutil.rmtree, dump, ignore_errors=True)
            env["LIBTPU_INIT_ARGS"] = f"{env.get('LIBTPU_INIT_ARGS', '')} {FLAG}={dump}".strip()
            env[DUMP_ENV] = dump
            state = "estimates"
    env[STATE_ENV] = state
    return state


STATE_REASONS = {
    "no_libtpu": "libtpu is not installed in the worker's environment "
                 "(pip install 'jax[tpu]' to compile for TPU chips on this host)",
    "disabled": f"TPU compiler estimates are turned off ({DISABLE_ENV}=0)",
    "flag_missing": f"this libtpu has no {FLAG} flag (the TPU compiler's static estimate "
                    "is an undocumented libtpu feature; another libtpu version may have it)",
    "unprepared": "the worker started libtpu without the estimate flag",
    "not_here": "this process compiles without the estimate flag (the judge's estimator "
                "processes have it)",
}


def estimate_state() -> tuple[bool, str | None]:
    """(estimates available, reason when not) for this process."""
    state = os.environ.get(STATE_ENV, "unprepared")
    if state == "estimates" and os.environ.get(DUMP_ENV):
        return True, None
    return False, STATE_REASONS.get(state, state)


# -- targets --------------------------------------------------------------------------

class Target:
    """Where a candidate is compiled: a device of an abstract topology (off-TPU) or the
    TPU itself (``native``)."""

    def __init__(self, chip: str, device: Any, native: bool) -> None:
        self.chip = chip
        self.device = device
        self.native = native

    def args(self, dyn: tuple, static: tuple) -> tuple:
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        if self.native:
            return (*dyn, *static)
        sharding = NamedSharding(Mesh([self.device], ("x",)), PartitionSpec())
        return (*(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in dyn),
                *static)


def target(chip: str) -> tuple[Target | None, str | None]:
    """The compile target for ``chip`` in this worker, or (None, why not)."""
    import jax

    if chip in _TARGETS:
        return _TARGETS[chip]
    device = jax.devices()[0]
    if device.platform == "tpu":
        from tilewright.profiling.chips import chip_for_device

        try:
            own = chip_for_device("tpu", device.device_kind).name
        except KeyError:
            own = None
        if own == chip:
            found: tuple[Target | None, str | None] = (Target(chip, device, True), None)
            _TARGETS[chip] = found
            return found
    if chip not in TOPOLOGIES:
        return None, (f"no TPU topology for chip {chip!r}; choose one of "
                      f"{', '.join(TOPOLOGIES)}")
    if libtpu_path() is None:
        return None, STATE_REASONS["no_libtpu"]
    try:
        from jax.experimental import topologies

        topo = topologies.get_topology_desc(topology_name=TOPOLOGIES[chip], platform="tpu")
        found = (Target(chip, topo.devices[0], False), None)
    except Exception as exc:  # libtpu refused: report it, the evaluation goes on
        found = (None, f"libtpu could not describe a {chip} topology: "
                       f"{str(exc).strip().splitlines()[0][:300]}")
    _TARGETS[chip] = found
    return found


@contextlib.contextmanager
def abstract_device(chip: str | None) -> Iterator[None]:
    """Lower on a CPU host as if for ``chip``: Pallas asks the device kind (integer
    division, ``sign``, pipelining) and must hear a TPU, not the CPU."""
    import jax
    from jax.sharding import AbstractDevice, AbstractMesh

    from tilewright.profiling.chips import DEFAULT_TPU, device_facts

    if chip is None or jax.devices()[0].platform == "tpu":
        yield
        return
    # The device kind and its TensorCores from the chip table (an unknown name: the
    # default TPU's), as the static analysis's abstract device says them too.
    facts = device_facts(chip) or device_facts(DEFAULT_TPU)
    assert facts is not None  # the default is a TPU of the table
    kind, cores = facts
    mesh = AbstractMesh((1,), ("_tilewright",),
                        abstract_device=AbstractDevice(device_kind=kind, num_cores=cores,
                                                       platform="tpu"))
    with jax.sharding.use_abstract_mesh(mesh):
        yield


# -- compiling ------------------------------------------------------------------------

def lower(fn: Any, dyn: tuple, static: tuple, where: Target) -> Any:
    """Trace and lower ``fn`` (a jitted callable) for ``where``; raises what lowering raises.
    Runs the candidate's Python (tracing): call it where the harness can check for
    tampering afterwards."""
    import jax

    if where.native:
        return fn.lower(*where.args(dyn, static))
    with jax.default_device(where.device):
        return fn.lower(*where.args(dyn, static))


COMPILE_STACK_BYTES = 256 << 20  # address space only; the estimator's recursion needs depth


def start() -> None:
    """Start the compile thread now: before the harness snapshots the live threads, so
    it is never mistaken for one a candidate left behind."""
    _executor()


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpu-compile")
        previous = threading.stack_size(COMPILE_STACK_BYTES)
        try:  # the pool starts its thread on the first submit: start it now, big
            _EXECUTOR.submit(lambda: None).result()
        finally:
            threading.stack_size(previous)
    return _EXECUTOR


def submit(lowered: Any, where: Target) -> Future[dict[str, Any]]:
    """Compile in the background (the compiler is C++: it overlaps with the trials)."""
    return _executor().submit(compile_lowered, lowered, where)


def compile_lowered(lowered: Any, where: Target) -> dict[str, Any]:
    """Compile for the target: ``{compile, message, kind, vmem_bytes, estimate,
    estimate_unavailable, compile_s}``. Never raises for the candidate's faults."""
    want_estimate, reason = estimate_state()
    if where.chip not in ESTIMATE_CHIPS and want_estimate:
        return {"compile": "unavailable", "kind": None, "vmem_bytes": None, "estimate": None,
                "message": f"no estimate for {where.chip}: "
                           f"{estimator_refusal(where.chip)}; start the worker with "
                           f"{DISABLE_ENV}=0 to compile for {where.chip} without estimates", "estimate_unavailable": None, "compile_s": 0.0}
    dump = os.environ.get(DUMP_ENV) if want_estimate else None
    started = time.perf_counter()
    with _LOCK:
        if dump:
            clear_dump(dump)
        try:
            compiled = lowered.compile()
        except Exception as exc:
            message = str(exc).strip()
            used, limit = vmem_from_error(message)
            return {"compile": "error", "message": message, "kind": classify(message),
                    "vmem_bytes": used, "vmem_limit_bytes": limit, "estimate": None,
                    "estimate_unavailable": None,
                    "compile_s": time.perf_counter() - started}
        cycles = _read_cycles(dump) if dump else None
    text = ""
    with contextlib.suppress(Exception):
        text = compiled.as_text()
    if cycles is None and want_estimate:
        reason = "the TPU compiler wrote no static estimate for this program"
    return {"compile": "ok", "message": None, "kind": None, "vmem_bytes": scoped_vmem(text),
            "estimate": estimate(cycles, where.chip) if cycles is not None else None,
            "estimate_unavailable": None if cycles is not None else reason,
            "compile_s": time.perf_counter() - started}


def clear_dump(dump: str) -> None:
    """Empty the dump directory (files from successive compiles accumulate there)."""
    for path in glob.glob(os.path.join(dump, "*")):
        with contextlib.suppress(OSError):
            os.remove(path)


def _read_cycles(dump: str) -> int | None:
    """The program's cycles: every record's cycles times the identical ops it stands
    for (``num_equivalent_hlos``; adding each record once undercounts repeated ops)."""
    found = read_dump(dump)
    return sum(record["cycles"] * record["count"] for record in found) if found else None


# The estimator's records: ``hlo_op_estimate { hlo_op_name: ... estimated_cycles: ... }``.
_RECORD = re.compile(r"hlo_op_estimate\s*\{")
_FIELD = {name: re.compile(rf"^\s*{name}:\s*\"?([^\"\n]+)\"?\s*$", re.MULTILINE)
          for name in ("hlo_op_name", "estimated_cycles", "num_equivalent_hlos",
                       "dma_instruction_type")}


def records(text: str) -> list[dict[str, Any]]:
    """The estimator's ``hlo_op_estimate`` records of one dump file: the op's name, its
    estimated cycles per op, how many identical ops the record stands for
    (``num_equivalent_hlos``: the total is cycles x count) and its DMA type (REMOTE
    ones, HBM traffic, come priced at 0 cycles)."""
    found = []
    starts = [m.end() for m in _RECORD.finditer(text)]
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(text)
        block = text[start:end]
        values = {k: (m.group(1).strip() if (m := rx.search(block)) else None)
                  for k, rx in _FIELD.items()}
        if values["hlo_op_name"] is None or values["estimated_cycles"] is None:
            continue
        try:
            cycles = int(values["estimated_cycles"])
            count = int(values["num_equivalent_hlos"] or 1)
        except ValueError:
            continue
        found.append({"name": values["hlo_op_name"], "cycles": cycles, "count": max(count, 1),
                      "dma": (values["dma_instruction_type"] or "").replace(
                          "DMA_INSTRUCTION_TYPE_", "").lower() or None})
    return found


def read_dump(dump: str) -> list[dict[str, Any]]:
    """Every record of the estimator's dump files in ``dump``."""
    found = []
    for path in sorted(glob.glob(os.path.join(dump, "*static_llo_profile*"))):
        with contextlib.suppress(OSError), \
                open(path, encoding="utf-8", errors="replace") as f:
            found += records(f.read())
    return found


def libtpu_version() -> str | None:
    """The installed libtpu's version (part of every cached compile's key): its package's
    (``profiling.chips.installed_libtpu``), else the library file's size and time."""
    from tilewright.profiling.chips import installed_libtpu

    version = installed_libtpu()
    if version is not None:
        return version
    path = libtpu_path()
    if path is None:
        return None
    stat = os.stat(path)
    return f"size{stat.st_size}-mtime{int(stat.st_mtime)}"


def estimate(cycles: int, chip: str) -> dict[str, Any]:
    """``{cycles, seconds, source}``; seconds only where the chip table has a clock."""
    from tilewright.profiling.chips import get_chip

    clock = getattr(get_chip(chip), "clock_hz", None)
    return {"cycles": int(cycles), "seconds": cycles / clock if clock else None,
            "source": SOURCE, "chip": chip}


def classify(message: str) -> str:
    if "ScopedVmemOom" in message or ("vmem" in message.lower() and "RESOURCE_EXHAUSTED"
                                      in message):
        return "vmem"
    if "Mosaic" in message:
        return "mosaic"
    return "tpu_compile"


def scoped_vmem(hlo_text: str) -> int | None:
    """The largest scoped VMEM a kernel of the compiled program uses, in bytes (from the
    ``tpu_custom_call`` backend configs)."""
    best = None
    for block in _SCOPED.findall(hlo_text):
        size = sum(int(s) for s in _SIZE.findall(block))
        best = size if best is None else max(best, size)
    return best


_OOM = re.compile(r"size ([\d.]+)([KMG]?) and limit ([\d.]+)([KMG]?)")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


_USED = re.compile(r"Used ([\d.]+)([KMG]?) of ([\d.]+)([KMG]?) vmem")


def vmem_from_error(message: str) -> tuple[int | None, int | None]:
    """(bytes the program asked for, the limit) from a VMEM overflow message: "Scoped
    allocation with size 24.00M and limit 16.00M exceeded ...", or the whole program's
    "Used 166.46M of 128.00M vmem" (its kernels' scoped VMEM and XLA's own temporaries
    against the chip's physical VMEM)."""
    if classify(message) != "vmem":
        return None, None
    match = _OOM.search(message) or _USED.search(message)
    if not match:
        return None, None
    return (int(float(match.group(1)) * _UNITS[match.group(2)]),
            int(float(match.group(3)) * _UNITS[match.group(4)]))


def short(message: str, limit: int = 600) -> str:
    """The compiler's message without its MLIR dump and bug-report boilerplate."""
    keep = []
    for line in message.splitlines():
        if line.startswith(("Please report a bug", "The MLIR operation involved")):
            break
        keep.append(line)
    text = "\n".join(keep).strip() or message.strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def vmem_capacity(chip: str) -> int | None:
    """The VMEM a core of ``chip`` has (what no limit can raise)."""
    from tilewright.profiling.chips import get_chip

    try:
        return get_chip(chip).vmem_bytes
    except KeyError:
        return None


def scoped_vmem_limit(chip: str) -> int | None:
    """The VMEM a kernel on ``chip`` may use without asking (``vmem_limit_bytes``)."""
    from tilewright.profiling.chips import get_chip

    try:
        return get_chip(chip).scoped_vmem_bytes
    except KeyError:
        return None
