"""The judge's TPU compile processes: the ``kernels.worker.tpu.compiler`` processes (the
verdict's, without the estimate flag; the candidates' estimator and the XLA reference's,
with it), the on-disk cache in front of them, and the host-wide slots that bound
estimator processes.

Every compile runs in a process with a memory limit and a deadline, so libtpu's aborts
and an estimator that wants too much memory or time cost an answer (``unavailable``
with the reason), never the worker. Answers are cached on disk by the exported
program's hash, the chip and the libtpu version. ``Slots`` allow a few estimator
processes per host (by memory), so parallel workers cannot take a laptop down.
``kernels.worker.tpu.estimates`` turns the answers into the numbers that rank kernels.

Worker-side (the judge).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tilewright.kernels.pool.env import ESTIMATE_CACHE
from tilewright.kernels.worker.tpu import tpu_compile

CACHE_ENV = ESTIMATE_CACHE  # the on-disk cache (a directory); unset: none
COMPILE_MEMORY_MB = 4096  # per compile process; an estimator above it costs the estimate
COMPILE_TIMEOUT_S = 150.0  # one compile, at most (and never past the evaluation's deadline)
CACHE_VERSION = 1


# -- the disk cache and the host's estimator slots ----------------------------------------

class DiskCache:
    """JSON answers by key under ``root`` (written atomically; unreadable entries are
    misses). Keys hash the exported program, so a source or shape change is a miss."""

    def __init__(self, root: str | None) -> None:
        self.root = Path(root) / f"v{CACHE_VERSION}" if root else None

    def _path(self, key: str) -> Path | None:
        return self.root / key[:2] / f"{key}.json" if self.root else None

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        path = self._path(key)
        if path is None:
            return
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(value))
            os.replace(tmp, path)


MEMORY_MAX_ENV = "TILEWRIGHT_COMPILE_MEMORY_MAX_MB"  # caps ``raised_memory_mb``


def raised_memory_mb() -> int:
    """The most a compile process may take on this host when the usual limit was not
    enough: a third of its memory, at most 12 GiB, never below ``COMPILE_MEMORY_MB``;
    ``TILEWRIGHT_COMPILE_MEMORY_MAX_MB`` caps it (a shared machine: no second try above
    the cap)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (ValueError, OSError, AttributeError):
        total = 3.0 * COMPILE_MEMORY_MB
    raised = max(COMPILE_MEMORY_MB, int(min(total / 3, 12 * 1024)))
    try:
        cap = int(os.environ.get(MEMORY_MAX_ENV) or 0)
    except ValueError:
        cap = 0
    return min(raised, cap) if cap > 0 else raised


def _slot_count(memory_mb: int) -> int:
    """Estimator processes this host runs at once: half its memory, one process's limit
    each, at least one."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (ValueError, OSError, AttributeError):
        return 1
    return max(1, int(total * 0.5 // max(memory_mb, 1)))


class Slots:
    """A host-wide semaphore of ``count`` slots as lock files under ``root`` (flock: a
    killed holder releases its slot). No root: no bound beyond this process."""

    def __init__(self, root: Path | None, count: int) -> None:
        self.root = root / "slots" if root else None
        self.count = count

    @contextlib.contextmanager
    def hold(self, deadline: float) -> Iterator[None]:
        if self.root is None:
            yield
            return
        import filelock

        with contextlib.suppress(OSError):
            self.root.mkdir(parents=True, exist_ok=True)
        held = None
        while held is None:
            for index in range(self.count):
                lock = filelock.FileLock(self.root / f"estimator-{index}.lock")
                try:
                    lock.acquire(timeout=0)  # a killed holder's lock goes with its process
                    held = lock
                    break
                except filelock.Timeout:
                    continue
                except OSError:
                    yield  # cannot coordinate: go ahead alone
                    return
            if held is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("every estimator slot of this host stayed busy")
                time.sleep(0.1)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                held.release()


# -- the compile processes ------------------------------------------------------------------

class Compilers:
    """The judge's compile processes (verdict: no estimate flag; estimate: with it, for
    the candidates; reference: with it, for the task's XLA reference, so a candidate's
    estimate never waits behind the reference's, which can take minutes), each used by
    one thread at a time, with the disk cache in front. Each process starts on its
    first compile, a fork of the judge's zygote: an evaluation whose programs are all
    on disk starts none."""

    def __init__(self) -> None:
        from tilewright.kernels.worker.candidate.judge import CandidateProcess

        # Always for an abstract topology: on a TPU host the device is the candidate's.
        cpu = {"JAX_PLATFORMS": "cpu"}
        self.procs = {"verdict": CandidateProcess("tilewright.kernels.worker.tpu.compiler",
                                                  env={**cpu, tpu_compile.DISABLE_ENV: "0"}),
                      "estimate": CandidateProcess("tilewright.kernels.worker.tpu.compiler", env=cpu),
                      "reference": CandidateProcess("tilewright.kernels.worker.tpu.compiler", env=cpu)}
        self.locks = {k: threading.Lock() for k in self.procs}
        root = os.environ.get(CACHE_ENV) or None
        self.cache = DiskCache(root)
        self.slots = Slots(self.cache.root, _slot_count(COMPILE_MEMORY_MB))
        self.libtpu = tpu_compile.libtpu_version() or "unknown"
        self.peak_rss_mb = 0.0  # the largest a compile process has grown (this judge)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.pid is not None]

    def compile(self, blob: bytes, chip: str, kind: str, deadline: float,
                memory_mb: int = COMPILE_MEMORY_MB, process: str | None = None,
                fingerprint: str | None = None, wait_for_slot: bool = True
                ) -> dict[str, Any]:
        """The compiler's answer for an exported program (``kind``: verdict | estimate),
        from the cache when this program was compiled for this chip by this libtpu;
        ``process`` names the compile process when it is not ``kind``'s own (the
        reference's estimates: ``reference``); ``fingerprint`` identifies the program
        instead of its bytes (which name the files it was traced from). Without
        ``wait_for_slot`` an estimate whose host slots are all taken is not waited for:
        ``unavailable``, ``why``: ``busy``."""
        what = fingerprint.encode() if fingerprint else blob
        parts = [kind.encode(), chip.encode(), self.libtpu.encode(), what]
        if memory_mb != COMPILE_MEMORY_MB:  # a crash under a lowered limit is that limit's
            parts.insert(0, f"memory={memory_mb}".encode())
        key = hashlib.sha256(b"|".join(parts)).hexdigest()
        cached = self.cache.get(key)
        if cached is not None:
            return {**cached, "cached": True}
        started, started_at = time.perf_counter(), time.monotonic()
        until = min(deadline, started_at + COMPILE_TIMEOUT_S)
        which = process or kind
        proc = self.procs[which]
        from tilewright.kernels.worker.candidate.judge import CandidateFailure

        try:
            with self.locks[which], (self.slots.hold(until if wait_for_slot else 0.0)
                                     if kind == "estimate" else contextlib.nullcontext()):
                proc.memory_limit_mb = memory_mb
                reply, _ = proc.request("compile", {"chip": chip}, blob, until)
        except TimeoutError as exc:
            return {"compile": "unavailable", "message": str(exc), "kind": None,
                    "why": "busy", "compile_s": time.perf_counter() - started}
        except CandidateFailure as failure:
            what = {"timeout": f"did not finish within {until - started_at:.0f} s",
                    "memory": f"needed more than its {memory_mb} MB memory limit"
                    }.get(failure.kind)
            if what is None:
                what = ("aborted: " + tpu_compile.short(failure.fatal, 400) if failure.fatal
                        else failure.message)
            answer = {"compile": "unavailable", "kind": None, "why": failure.kind,
                      "fatal": failure.fatal, "what": what,
                      "message": f"the TPU compiler{' (estimator)' if kind == 'estimate' else ''}"
                                 f" {what}", "compile_s": time.perf_counter() - started}
            if failure.kind == "crashed":  # deterministic: the same program aborts again
                self.cache.put(key, answer)
            raised = raised_memory_mb()
            if failure.kind == "memory" and memory_mb < raised \
                    and time.monotonic() < deadline - 5.0:
                # The compiler's memory grows with the program (the estimator's with big
                # blocks and long grids): once more with what this machine can give it,
                # rather than no number.
                again = self.compile(blob, chip, kind, deadline, raised, process,
                                     fingerprint, wait_for_slot)
                return {**again, "memory_raised": [memory_mb, raised]}
            return answer
        answer = {k: v for k, v in reply.items() if k not in ("id", "ok", "peak_rss_mb")}
        if isinstance(reply.get("peak_rss_mb"), int | float):
            self.peak_rss_mb = max(self.peak_rss_mb, float(reply["peak_rss_mb"]))
        if answer.get("compile") in ("ok", "error"):
            self.cache.put(key, answer)
        return {**answer, "cached": False}


@functools.cache
def compilers() -> Compilers:
    """This judge's compile processes (each started on its first cache miss)."""
    return Compilers()


def kept_pids() -> list[int]:
    """The compile processes' pids, which the worker's after-request cleanup spares."""
    return compilers().pids() if compilers.cache_info().currsize else []
