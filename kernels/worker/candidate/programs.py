"""The candidate's traced programs, as the candidate process makes and hands them on:
one way to trace (``trace``: a fresh thread, under an abstract chip), its pallas_calls
interpreted off a TPU (``interpreted``), exported for the judge's device
(``exported_program``), and facts read from them (``empty_grids``, ``fingerprint``).
``kernels.worker.candidate.main`` serves the ops that use them."""

from __future__ import annotations

import threading
from typing import Any

from tilewright.profiling.chips import DEFAULT_TPU


def interpreted(closed: Any) -> Any:
    """A function evaluating ``closed`` with every ``pallas_call`` in TPU interpret mode
    (Pallas fixes the mode when the call is traced; off-TPU the traced program must run
    interpreted), wherever it sits: nested ``jit``s, the forward program of a
    ``custom_vjp`` (jax's flash attention, splash attention, most training kernels), a
    ``checkpoint``, ``cond`` branches, ``scan`` bodies (``execution.rebound`` with
    ``expand``). Nothing else changes and no candidate Python runs."""
    from jax.experimental.pallas import tpu as pltpu

    from tilewright.kernels.worker.execution import bind_as_traced, rebound

    params = pltpu.InterpretParams()

    def bind(eqn: Any, invals: list[Any]) -> list[Any]:
        if eqn.primitive.name != "pallas_call":
            return bind_as_traced(eqn, invals)
        return bind_as_traced(eqn, invals, {**eqn.params, "interpret": params})

    # every kernel the program reaches: inside custom_vjp (library kernels), cond, scan
    return rebound(closed, bind, expand=True)


def exported_program(closed: Any, flat: list[Any], platform: str, chip: str | None) -> bytes:
    """The traced program serialized for the judge to run (``jax.export``): for a TPU,
    StableHLO with its Mosaic kernels (``production.export``, the same export as the
    production shape's); for the CPU (tests of this route off a TPU), with every
    ``pallas_call`` in the plain interpreter, which lowers to HLO without callbacks."""
    import jax

    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in flat]
    if platform == "tpu":
        from tilewright.kernels.worker.candidate import production as prod

        return prod.export(closed, avals, chip or DEFAULT_TPU)
    from tilewright.kernels.worker.execution import bind_as_traced, rebound

    def bind(eqn: Any, invals: list[Any]) -> list[Any]:
        if eqn.primitive.name != "pallas_call":
            return bind_as_traced(eqn, invals)
        return bind_as_traced(eqn, invals, {**eqn.params, "interpret": True})

    fn = jax.jit(rebound(closed, bind, expand=True))
    return bytes(jax.export.export(fn, platforms=(platform,))(*avals).serialize())


def trace(fn: Any, args: tuple[Any, ...], chip: str | None) -> Any:
    """``fn.trace(*args)`` (under an abstract ``chip`` device), made the one way every
    trace of the candidate is made, check shapes and production alike: in a fresh thread
    of one name, with nothing of the harness on its stack. The candidate cannot tell a
    production trace from a checked one by its caller (a frame named "production", the
    op being served): only by the shapes, and what it does with those is compared."""
    from tilewright.kernels.worker.tpu import tpu_compile

    found: dict[str, Any] = {}

    def traced() -> None:
        try:
            with tpu_compile.abstract_device(chip):
                found["traced"] = fn.trace(*args)
        except BaseException as exc:  # re-raised in the caller, SystemExit included
            found["error"] = exc

    from tilewright.kernels.worker.evaluation import integrity

    thread = threading.Thread(target=traced, name="tw-trace", daemon=True)
    with integrity.candidate_code():
        thread.start()
        thread.join()
    if "error" in found:
        raise found["error"]
    return found["traced"]


def empty_grids(closed: Any) -> list[str]:
    """Kernels whose grid has no step (a block larger than the array it tiles, floor-
    divided: ``rows // BLOCK`` = 0), in words."""
    from tilewright.kernels.worker.candidate.production import kernel_name, pallas_eqns

    found = []
    for eqn in pallas_eqns(closed.jaxpr):
        gm = eqn.params["grid_mapping"]
        grid = tuple(int(g) if isinstance(g, int) else -1 for g in gm.grid)
        if 0 not in grid:
            continue
        blocks = []
        for bm in gm.block_mappings:
            dims = [getattr(b, "block_size", b) for b in bm.block_shape]
            blocks.append(f"{'x'.join(str(d) for d in dims if isinstance(d, int))} of "
                          f"{'x'.join(str(int(d)) for d in bm.array_aval.shape)}")
        name = kernel_name(eqn)
        found.append(f"{name}: grid {grid}, blocks {', '.join(blocks[:4])}")
    return found


def fingerprint(closed: Any) -> str:
    """A traced program, as a hash of its printed jaxpr and of what that print leaves
    out of its kernels: each block's index map, buffering and memory space, the scratch
    and the scalar-prefetch operands (a kernel that walks its grid in another order
    prints the same jaxpr). Deterministic for one program, and without source
    locations: the same program traced from another file, or from another version's
    source whose own limits clamp a block size back (``BLOCK_K = 2048`` in a kernel that
    halves it until it fits VMEM), has the same one."""
    import hashlib

    from tilewright.kernels.worker.candidate.production import pallas_eqns

    parts = [str(closed)]
    for eqn in pallas_eqns(closed.jaxpr):
        gm = eqn.params["grid_mapping"]
        parts.append(f"grid {gm.grid} index operands {gm.num_index_operands} scratch "
                     f"{gm.scratch_avals} vmapped {gm.vmapped_dims}")
        for bm in gm.block_mappings:
            parts.append(f"{bm.block_shape} {bm.transformed_block_aval} {bm.array_aval} "
                         f"{bm.transforms} {bm.pipeline_mode}\n{bm.index_map_jaxpr}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
