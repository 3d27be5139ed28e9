"""Which ops of an XLA program the TPU compiler's estimate prices at 0 cycles, per chip.

The estimator gives some fusions that stream from HBM (DMA type REMOTE) 0 cycles: the
judge then calls an estimate ``incomplete`` and its memory floor prices the program
(``kernels/worker/tpu/fidelity.py``). This compiles one such program, a layer
normalization written in jnp (bf16 in and out, f32 statistics: tokamax's
``normalization`` op's arithmetic), at the shapes tokamax timed on TPU7x and at
4096x8192, over the leading and the trailing axis, for each chip asked, and prints each
op's cycles and DMA type: which shapes leave which ops unpriced, and the program's total.

    python benchmarks/estimates/unpriced_ops.py [--chips v5e v6e v7x] [--json OUT]

v7x needs libtpu 0.0.50 or newer (jax 0.12, Python 3.12: ``.venv-current``); a chip this
libtpu does not estimate is said so and skipped. ``--smoke``: one small shape for v5e.
The run in docs/EVALUATION.md ("Fusions priced at 0 cycles"):
``benchmarks/data/unpriced_ops_2026-12-07.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

SHAPES = [((128, 384, 384), 0), ((128, 768, 768), 0), ((384, 384, 64), -1),
          ((384, 384, 128), -1), ((768, 768, 128), -1), ((4096, 8192), -1), ((4096, 8192), 0)]


def layer_norm(x: Any, scale: Any, offset: Any, axis: int) -> Any:
    import jax
    import jax.numpy as jnp

    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=axis, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axis, keepdims=True)
    shape = [1] * x.ndim
    shape[axis] = -1
    return ((xf - mean) * jax.lax.rsqrt(var + 1e-6) * scale.reshape(shape)
            + offset.reshape(shape)).astype(x.dtype)


def run(chips: list[str], shapes: list[tuple[tuple[int, ...], int]]) -> list[dict[str, Any]]:
    from tilewright.kernels.worker.tpu import tpu_compile as tc

    dump = tempfile.mkdtemp(prefix="unpriced-")
    tc.prepare_environment(os.environ, dump)
    import jax
    import jax.numpy as jnp

    from tilewright.profiling.chips import estimator_refusal

    rows = []
    for chip in chips:
        refusal = estimator_refusal(chip)
        where, why = tc.target(chip)
        if refusal or where is None:
            print(f"{chip}: not estimated here ({refusal or why})")
            continue
        for shape, axis in shapes:
            x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
            s = jax.ShapeDtypeStruct((shape[axis],), jnp.float32)
            fn = jax.jit(lambda x, s, o, axis=axis: layer_norm(x, s, o, axis))
            out = tc.compile_lowered(tc.lower(fn, (x, s, s), (), where), where)
            ops = [{"name": r["name"], "cycles": r["cycles"], "count": r["count"],
                    "dma": r["dma"]} for r in tc.read_dump(os.environ[tc.DUMP_ENV])]
            row = {"chip": chip, "shape": list(shape), "axis": axis, "dtype": "bfloat16",
                   "cycles": (out.get("estimate") or {}).get("cycles"), "ops": ops,
                   "unpriced": [o["name"] for o in ops if o["cycles"] == 0]}
            rows.append(row)
            print(f"{chip} bf16{list(shape)} axis {axis}: {row['cycles']:,} cycles; "
                  f"{len(row['unpriced'])} of {len(ops)} ops at 0 cycles "
                  + ", ".join(f"{o['name']} {o['cycles']:,} ({o['dma']})" for o in ops))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chips", nargs="+", default=["v5e", "v6e", "v7x"])
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--smoke", action="store_true", help="one small shape for v5e")
    args = parser.parse_args(argv)
    if args.smoke:
        print("smoke: bf16[8,128,256] over the leading axis, v5e only")
        run(["v5e"], [((8, 128, 256), 0)])
        return 0
    rows = run(args.chips, SHAPES)
    if args.json:
        import jax

        from tilewright.profiling.chips import installed_libtpu

        args.json.write_text(json.dumps({"jax": jax.__version__, "libtpu": installed_libtpu(),
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
