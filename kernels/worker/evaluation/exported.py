"""The candidate's programs as the judge runs them: the route of a host with a chip.

libtpu admits one process per chip, and candidate Python never runs in the judge. So on
a TPU host the candidate process (on the CPU, ``kernels.worker.chip``) traces its entry
once per shape configuration, as everywhere, and exports that one jaxpr for the chip
(``jax.export``: StableHLO with its Mosaic kernels, no Python); the judge deserializes
it here, checks it, compiles it for its own device and runs it on its own inputs for
every trial and timed call. What is timed is what was judged: the integrity checks read
this very program (``hlo_text``), not a text the candidate sent beside it.

What the judge checks before anything runs (an exported program is untrusted data):
- it was exported for this platform, for one device, with no shape polymorphism, and
  its inputs are exactly the arrays the judge will pass (shapes and dtypes);
- its custom calls are ones jax.export itself guarantees (the Mosaic kernel call
  ``tpu_custom_call``, sharding annotations, the linear-algebra kernels): a host
  callback, which would run Python of the candidate's in this process, is refused;
- its outputs are at most ``output_limit`` bytes together (no memory bomb).

Off a TPU the same route can be taken for tests (``route = "exported"`` with platform
``cpu``): the candidate exports its program with every ``pallas_call`` in the plain
interpreter (pure HLO, no callbacks), and the judge runs it on its CPU.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewright.kernels.judge.result import EvalError
from tilewright.kernels.worker.errors import Stopped, short_message
from tilewright.kernels.worker.evaluation.compare import Host

# jax.export's own list of custom calls whose behaviour is stable across versions, less
# TensorFlow's (it calls a TF function); read from jax where this version has it.
_OWN_ALLOWED = frozenset({"tpu_custom_call", "Sharding", "SPMDFullToShardShape",
                          "SPMDShardToFullShape", "shape_assertion", "AllocateBuffer",
                          "annotate_device_placement", "ApproxTopK", "Qr", "Eigh",
                          "LuDecomposition", "ProductOfElementaryHouseholderReflectors"})
_REFUSED = frozenset({"tf.call_tf_function"})
_CUSTOM_CALL = re.compile(r'call_target_name\s*=\s*"([^"]+)"|stablehlo\.custom_call\s+@([\w.$-]+)')
_TEXT_LIMIT = 8 << 20


def allowed_custom_calls() -> frozenset[str]:
    try:
        from jax._src.export import _export

        stable = frozenset(_export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE)
    except (ImportError, AttributeError):  # moved in another jax: our own copy
        stable = _OWN_ALLOWED
    return (stable | _OWN_ALLOWED) - _REFUSED


def custom_calls(text: str) -> set[str]:
    """The custom call targets a StableHLO module's text names."""
    return {a or b for a, b in _CUSTOM_CALL.findall(text)}


_LOCKS_GUARD = threading.Lock()


@dataclass
class Program:
    """One shape configuration's program, deserialized, checked and compiled here."""

    config: str
    exported: Any
    compiled: Any
    text: str
    compile_s: float
    out_bytes: int


@dataclass
class ExportedPrograms:
    """The candidate's exported programs for one evaluation, run on the judge's device.
    ``platform``: what they are exported for (``tpu`` on a TPU host)."""

    platform: str
    output_limit: int = 0  # bytes; 0: no limit (set per configuration by the judge)
    programs: dict[str, Program] = field(default_factory=dict)
    adopted_s: float = 0.0
    # the device's executables by the exported bytes' sha256: the production shape is a
    # check shape too, and its program, exported twice, is compiled once
    compiled: dict[str, Any] = field(default_factory=dict)
    # one compile per program at a time: the production verdict compiles in a thread of
    # its own while the trials adopt the same bytes at the check shape of that size
    locks: dict[str, threading.Lock] = field(default_factory=dict)

    def _compile_once(self, digest: str, build: Any) -> Any:
        with _LOCKS_GUARD:
            lock = self.locks.setdefault(digest, threading.Lock())
        with lock:
            compiled = self.compiled.get(digest)
            if compiled is None:
                compiled = build()
                self.compiled[digest] = compiled
            return compiled

    def adopt(self, config: str, blob: bytes, dyn: tuple, kernel_line: int | None,
              output_limit: int) -> Program:
        """Deserialize, check and compile the program the candidate exported for
        ``config`` (whose inputs are ``dyn``, the judge's own arrays). A program that
        fails a check is ``rejected``; one the device's compiler refuses (VMEM or HBM
        exhausted, a Mosaic error) is a ``compile_error`` with the compiler's words."""
        import jax

        started = time.perf_counter()
        flat = jax.tree.leaves(dyn)
        exported, text, out_bytes = self._checked(
            blob, [(tuple(a.shape), np.dtype(a.dtype)) for a in flat], output_limit)
        digest = hashlib.sha256(blob).hexdigest()
        try:
            compiled = self._compile_once(
                digest, lambda: jax.jit(exported.call).lower(*flat).compile())
        except Exception as exc:
            raise Stopped("compile_error", EvalError(
                kind="compile", message=f"the {self.platform.upper()} compiler refused the "
                f"kernel at {config}: {short_message(exc)}", line=kernel_line,
                hint=_compile_hint(short_message(exc)))) from None
        program = Program(config, exported, compiled, text[:_TEXT_LIMIT],
                          time.perf_counter() - started, out_bytes)
        self.programs[config] = program
        self.adopted_s += program.compile_s
        return program

    def compile_only(self, blob: bytes, inputs: list[tuple[tuple[int, ...], str]]) -> None:
        """Compile ``blob`` for inputs of these shapes and dtypes and keep the executable
        (``adopt`` of the same bytes then compiles nothing): the production verdict on a
        TPU host, from a thread of its own while the trials run. It is checked as
        ``adopt`` checks it first (``Stopped("rejected")``); the compiler's error is
        raised as it is."""
        import jax

        want = [(tuple(shape), np.dtype(dtype)) for shape, dtype in inputs]
        exported, _text, _out = self._checked(blob, want, 0)  # what adopt checks, first
        avals = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in want]
        self._compile_once(hashlib.sha256(blob).hexdigest(),
                           lambda: jax.jit(exported.call).lower(*avals).compile())

    def _checked(self, blob: bytes, want: list[tuple[tuple[int, ...], Any]],
                 output_limit: int) -> tuple[Any, str, int]:
        """The program in ``blob``, checked before anything compiles or runs it: it
        deserializes, takes exactly ``want`` (shapes and dtypes), is for this platform and
        one device, calls no custom call beyond the allowed ones, and (``output_limit``)
        returns no more bytes than allowed; ``(exported, its text, output bytes)``, or
        ``Stopped("rejected")``."""
        import jax

        try:
            exported = jax.export.deserialize(bytearray(blob))
        except Exception as exc:
            raise _rejected(f"the candidate process sent a program that does not "
                            f"deserialize ({short_message(exc)[:200]})") from None
        try:
            got = [(tuple(int(d) for d in a.shape), np.dtype(a.dtype))
                   for a in exported.in_avals]
        except TypeError:  # a symbolic dimension
            raise _rejected("the exported program has symbolic shapes; the judge runs "
                            "programs exported for the exact input shapes") from None
        if got != want:
            raise _rejected(f"the exported program takes {got}, the judge's inputs are "
                            f"{want}")
        platforms = tuple(str(p).lower() for p in exported.platforms)
        if self.platform not in platforms:
            raise _rejected(f"the exported program is for {platforms}, the judge runs on "
                            f"{self.platform}")
        if int(getattr(exported, "nr_devices", 1)) != 1:
            raise _rejected("the exported program is for several devices; the judge runs "
                            "one chip")
        text = exported.mlir_module()
        foreign = sorted(custom_calls(text) - allowed_custom_calls())
        if foreign:
            raise _rejected(f"the exported program calls {', '.join(foreign[:5])}: only "
                            "kernels and the custom calls jax.export guarantees run in the "
                            "judge (a host callback would run the candidate's Python here)")
        out_bytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                        for a in exported.out_avals)
        if output_limit and out_bytes > output_limit:
            raise _rejected(f"the exported program's outputs take {out_bytes} bytes, more "
                            f"than twice the reference's ({output_limit} allowed)")
        return exported, text, out_bytes

    def run(self, config: str, dyn: tuple, expected: Host, tree: str | None,
            kernel_line: int | None = None) -> Host:
        """One trial on the judge's device: the outputs as the comparison takes them."""
        import jax

        out = self._execute(config, jax.tree.leaves(dyn), kernel_line)
        dtype = out[0].dtype if out else None
        return Host([np.asarray(leaf, dtype=np.float32) for leaf in out],  # no copy of f32
                    tree or expected.tree, dtype)

    def function(self, config: str) -> Any:
        """The exported program as a function of the flat inputs, for the device timing
        (``timing.time_on_device`` jits it under a name of its own)."""
        return self.programs[config].exported.call

    def _execute(self, config: str, flat: list[Any], kernel_line: int | None) -> list[Any]:
        import jax

        compiled = self.programs[config].compiled
        try:
            out = jax.block_until_ready(compiled(*flat))
        except Exception as exc:
            message = short_message(exc)
            raise Stopped("runtime_error", EvalError(
                kind="runtime", message=f"the kernel failed on the {self.platform.upper()} "
                f"at {config}: {message}", line=kernel_line,
                hint=_compile_hint(message))) from None
        return list(jax.tree.leaves(out))


def _rejected(message: str) -> Stopped:
    return Stopped("rejected", EvalError(kind="exported_program", message=message,
                                         hint="Submit the kernel as Python source; the judge "
                                              "exports and checks it itself."),
                   flags=("harness_tampering",))


def _compile_hint(message: str) -> str | None:
    lowered = message.lower()
    if "vmem" in lowered:
        return ("The kernel's blocks do not fit the chip's VMEM at this shape: use smaller "
                "blocks, or raise vmem_limit_bytes in pltpu.CompilerParams within the chip's "
                "capacity.")
    if "hbm" in lowered or "resource_exhausted" in lowered or "out of memory" in lowered:
        return ("The program needs more device memory (HBM) than the chip has at this "
                "shape: its temporaries or outputs are too large.")
    return None
