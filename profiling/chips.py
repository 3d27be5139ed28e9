"""The chip table, the roofline and the TPU's block tiling rule.

Per-chip peak figures a kernel author reasons with: matrix-unit FLOP/s for bf16 and
f32, HBM bandwidth, on-core VMEM (TPU) or shared memory per SM (GPU), the default
scoped VMEM limit a Pallas kernel gets without ``vmem_limit_bytes``, and how many
cores one device spreads a ``parallel`` grid axis over. ``bound()`` is the roofline:
the time no kernel can beat for a given amount of work and traffic on that chip.
``tiles`` and ``misaligned`` are the (8, 128) rule a ``pallas_call`` block must keep,
written once for the task shapes, the tunables, the static analysis and the fixes.

Sources (public, as of 2025; figures are per chip unless noted):
- TPU: Google Cloud TPU "System architecture" pages, one per generation
  (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e, /tpu7x). VMEM capacities and
  TensorCore counts are not on those pages; they come from JAX's own table in
  ``jax/_src/pallas/mosaic/tpu_info.py`` (jax 0.10.2), which the Pallas lowering uses.
- Default scoped VMEM limit: 16 MiB on v4/v5e/v5p and 32 MiB on v6e, as the Pallas TPU
  docs' pipelining guide gives them (quoted from that page, which cannot be re-read
  offline here: treat them as the usual defaults, not guarantees); for v7x we assume
  32 MiB (XLA's ``--xla_tpu_scoped_vmem_limit_kib`` default, not on a docs page: the
  least certain figure in this table). ``CompilerParams(vmem_limit_bytes=...)`` raises
  the limit for one kernel up to the physical VMEM.
- f32 on TPU: no public figure. The MXU multiplies bf16; f32 dots run as several
  bf16 passes (3 for precision HIGH, 6 for HIGHEST). We list bf16/3 as an estimate
  and mark it ``f32_estimated``.
- GPU: NVIDIA H100 and H200 datasheets (SXM form factor, dense figures, i.e.
  the datasheet's sparsity figures halved). "VMEM" for a GPU is the per-SM shared
  memory (228 KiB on Hopper, 227 KiB usable per block); the "scoped default" is
  the 48 KiB a block gets without opting in to more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# A worker's mode on a host without a TPU: Pallas kernels run in TPU interpret mode
# (simulated; timings are host time). Defined here, the lowest layer, so profile
# reports and ``kernels.judge.result.Backend`` test it the same way.
TPU_INTERPRET = "tpu-interpret"


def backend_is_interpret(backend: dict[str, Any] | None) -> bool:
    """A recorded backend (profile JSON, eval JSON, a session header) ran interpreted."""
    return bool(backend) and backend.get("mode") == TPU_INTERPRET  # type: ignore[union-attr]


@dataclass(frozen=True)
class Chip:
    name: str  # our short key, e.g. "v5e"
    label: str  # what a person reads, e.g. "TPU v5e"
    kind: str  # tpu | gpu | cpu
    bf16_flops: float  # peak FLOP/s, dense
    f32_flops: float  # peak FLOP/s for f32 matmul work (see f32_estimated)
    hbm_bytes_per_s: float
    hbm_bytes: float
    vmem_bytes: int  # per core (TPU VMEM, GPU shared memory per SM)
    scoped_vmem_bytes: int  # default limit one kernel may use
    cores: int  # TensorCores per chip (TPU), SMs (GPU), cores (CPU)
    megacore: bool  # two TensorCores per chip that a short "parallel" grid leaves half idle
    f32_estimated: bool = False
    note: str = ""
    # TensorCore clock, to turn the TPU compiler's cycle estimates into seconds. Not on
    # the product pages: derived as bf16_flops / (cores x MXUs x 128 x 128 x 2) from the
    # MXU counts in JAX's tpu_info table, given only where that derivation is
    # consistent (v4 gives 1.05 GHz, the figure of the TPU v4 paper). None: unknown;
    # cycle ratios (estimated speedups) do not need it.
    clock_hz: float | None = None
    # The matrix unit's rate for int8 and fp8 operands where the chip has one (the
    # product pages' int8 TOPS and fp8 TFLOP/s); None: they run at the bf16 rate.
    int8_flops: float | None = None
    fp8_flops: float | None = None

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where a bf16 kernel turns from memory- to compute-bound."""
        return self.bf16_flops / self.hbm_bytes_per_s

    def peak_flops(self, dtype: str) -> float:
        return self.f32_flops if dtype in ("f32", "float32") else self.bf16_flops

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ridge_intensity": self.ridge_intensity}


def _tpu(name: str, bf16_flops: float, hbm_bytes_per_s: float, hbm_bytes: float,
         vmem_bytes: int, scoped_vmem_bytes: int, *, cores: int, **rest: Any) -> Chip:
    """A TPU generation's row: "TPU <name>", f32 matmul work at a third of the bf16 rate
    (``f32_estimated``: see the sources above), and two TensorCores a megacore."""
    return Chip(name, f"TPU {name}", "tpu", bf16_flops, bf16_flops / 3, hbm_bytes_per_s,
                hbm_bytes, vmem_bytes, scoped_vmem_bytes, cores, cores == 2,
                f32_estimated=True, **rest)


# Where the table has no clock (v7x), memory floors and rooflines are counted in cycles
# at a clock no TPU runs below: the table's slowest is v4's 1.05 GHz, and the v7x programs
# tokamax timed imply 1.15-1.76 GHz where the estimator priced every op (their cycles
# over their measured times; benchmarks/estimates/tokamax_v7x.py). A floor counted at a
# clock lower than the chip's is lower than the chip's own: it rejects only an estimate
# below the floor at any clock the chip may run at.
SLOWEST_CLOCK_HZ = 0.85e9

CHIPS: dict[str, Chip] = {
    # int8 and fp8 rates: the same pages (v4: 275 TFLOP/s for bf16 or int8; v5e 394 int8
    # TOPS; v5p 918; v6e 1,836; TPU7x 4,614 fp8 TFLOP/s).
    # TPU v4: 275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s (cloud.google.com/tpu/docs/v4).
    # 2 TensorCores in megacore mode; 16 MiB VMEM per core (jax tpu_info).
    "v4": _tpu("v4", 275e12, 1200e9, 32 * GiB, 16 * MiB, 16 * MiB, cores=2, clock_hz=1.05e9,
               int8_flops=275e12),
    # TPU v5e: 197 TFLOP/s bf16, 16 GiB HBM2 at 819 GB/s (cloud.google.com/tpu/docs/v5e).
    # 1 TensorCore; 128 MiB VMEM (jax tpu_info).
    "v5e": _tpu("v5e", 197e12, 819e9, 16 * GiB, 128 * MiB, 16 * MiB, cores=1, clock_hz=1.5e9,
                int8_flops=394e12),
    # TPU v5p: 459 TFLOP/s bf16, 95 GiB HBM2e at 2,765 GB/s (cloud.google.com/tpu/docs/v5p).
    # 2 TensorCores in megacore mode; 64 MiB VMEM per core (jax tpu_info).
    "v5p": _tpu("v5p", 459e12, 2765e9, 95 * GiB, 64 * MiB, 16 * MiB, cores=2, clock_hz=1.75e9,
                int8_flops=918e12),
    # TPU v6e (Trillium): 918 TFLOP/s bf16, 32 GiB HBM at 1,640 GB/s
    # (cloud.google.com/tpu/docs/v6e). 1 TensorCore; 128 MiB VMEM (jax tpu_info).
    # Clock 1.75 GHz: not on the product page, and jax tpu_info's MXU count (2 of
    # 256x256) would give 3.5 GHz; 1.75 GHz is what 918 TFLOP/s means with four such
    # MXUs, and the clock at which the TPU compiler's cycle counts for plain GEMMs match
    # the device times upstream JAXBench recorded on v6e-1 (0.99-1.00 of measured;
    # benchmarks/estimates/estimate_fidelity.py).
    "v6e": _tpu("v6e", 918e12, 1640e9, 32 * GiB, 128 * MiB, 32 * MiB, cores=1, clock_hz=1.75e9,
                int8_flops=1836e12),
    # TPU7x (Ironwood): 2,307 TFLOP/s bf16 (4,614 fp8), 192 GiB HBM3e at 7.37 TB/s
    # (cloud.google.com/tpu/docs/tpu7x; Google's Ironwood announcement says 7.37 TB/s,
    # jax tpu_info uses 7.40e12: the two differ in rounding only). 2 TensorCores per chip,
    # 64 MiB VMEM each (jax tpu_info). JAX does not fuse them into one megacore device:
    # each core is its own device unless the kernel splits work with core_map /
    # CORE_PARALLEL, so a small grid still leaves one of the two cores idle.
    "v7x": _tpu("v7x", 2307e12, 7.37e12, 192 * GiB, 64 * MiB, 32 * MiB, cores=2,
                fp8_flops=4614e12, note="scoped VMEM default (32 MiB) assumed, not published"),
    # H100 SXM5: 989 TFLOP/s bf16 dense, 67 TFLOP/s f32 (non-tensor), 495 TFLOP/s TF32
    # dense; 80 GB HBM3 at 3.35 TB/s; 132 SMs, 228 KiB shared memory per SM
    # (NVIDIA H100 datasheet; Hopper tuning guide for shared memory).
    "h100": Chip("h100", "H100 SXM", "gpu", 989e12, 67e12, 3.35e12, 80e9,
                 228 * KiB, 48 * KiB, 132, False,
                 note="f32 is the non-tensor-core figure; TF32 tensor cores: 495 TFLOP/s"),
    # H200 SXM: same Hopper compute as H100 SXM (989 TFLOP/s bf16 dense, 67 f32);
    # 141 GB HBM3e at 4.8 TB/s (NVIDIA H200 datasheet).
    "h200": Chip("h200", "H200 SXM", "gpu", 989e12, 67e12, 4.8e12, 141e9,
                 228 * KiB, 48 * KiB, 132, False,
                 note="f32 is the non-tensor-core figure; TF32 tensor cores: 495 TFLOP/s"),
    # CPU: a NOMINAL figure for this host class (2 vCPUs of an Intel Xeon Ice Lake at
    # 2.8 GHz, AVX-512 with 2 FMA ports): 2 cores x 2.8e9 Hz x 64 f32 FLOP/cycle
    # (2 ports x 16 lanes x 2) = 358 GFLOP/s. Ice Lake has no AVX512-BF16, so bf16 runs
    # at the f32 rate at best. Bandwidth: 24 GB/s, what a numpy copy of 64 MiB measured
    # on this VM (read+write, one thread); the socket's 8 DDR4 channels are shared
    # with other tenants. "VMEM" here is the 1.25 MiB L2 per core. Interpret-mode
    # timings are far from both figures: they time a simulator, not the chip.
    "cpu": Chip("cpu", "CPU (nominal)", "cpu", 358e9, 358e9, 24e9, 23 * GiB,
                1280 * KiB, 1280 * KiB, 2, False,
                note="nominal host figures; interpret mode simulates a TPU and is slower"),
}

ALIASES: dict[str, str] = {
    "tpu v4": "v4", "tpu v5e": "v5e", "tpu v5 lite": "v5e", "v5litepod": "v5e",
    "tpu v5": "v5p", "tpu v5p": "v5p", "tpu v6e": "v6e", "tpu v6 lite": "v6e",
    "trillium": "v6e", "tpu7x": "v7x", "tpu 7x": "v7x", "ironwood": "v7x", "7x": "v7x",
    "nvidia h100 80gb hbm3": "h100", "h100 sxm": "h100", "nvidia h200": "h200",
    "h200 sxm": "h200", "host": "cpu",
}


# The TPU generation a host without a TPU compiles, estimates and analyzes kernels for
# when none is chosen (a TPU host uses its own chip). The one place this default is
# written: the harness, the profile op, the CLIs' help and the app's gauges read it here.
DEFAULT_TPU = "v5e"

# How JAX names one device of each TPU generation (``device.device_kind``): what an
# abstract device off-TPU must say so that Pallas lowers as it would on that chip.
DEVICE_KINDS: dict[str, str] = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5",
                                "v6e": "TPU v6 lite", "v7x": "TPU7x"}
# What libtpu's static estimator (the figure that ranks kernels off-TPU) does for each
# TPU generation, measured here with libtpu 0.0.42.1 compiling for an abstract topology:
# None where it estimates; else why it does not, and the chip then only compiles
# (verdicts, VMEM, Mosaic's refusals) without an estimate.
ESTIMATOR_REFUSALS: dict[str, str | None] = {
    "v5e": None, "v5p": None, "v6e": None,
    "v4": "libtpu's estimator aborts the whole process on a v4 program (its DMA model "
          "knows v5e, v5p and v6e only)",
    "v7x": "libtpu's estimator fails an internal check on every v7x program tried (a "
           "plain XLA add, an XLA matmul, a Pallas matmul: LLO_CHECK "
           "LloOpcodeIsScalarBranch, then abort), so v7x compiles without an estimate",
}


# The first libtpu whose estimator returned cycles for v7x programs on a CPU host (the
# version jax 0.12 brings, on Python 3.12: a 4096^3 bf16 XLA matmul for tpu7x:2x2x1,
# 280,908 cycles, measured 2026-12-06); 0.0.42.1 (jax 0.10.2) aborts on them.
V7X_ESTIMATING_LIBTPU = (0, 0, 50)


def installed_libtpu() -> str | None:
    """The installed libtpu's version from its package metadata (no JAX, no libtpu
    loaded: the app's process may ask), or None."""
    from importlib import metadata

    for name in ("libtpu", "libtpu-nightly"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "").split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def estimator_refusal(name: str, libtpu: str | None = None) -> str | None:
    """Why libtpu's estimator gives no figure for this chip (None: it does), for the
    libtpu in use (``libtpu``: that version instead of the installed one). Chips it was
    never tried on say so."""
    if name == "v7x":
        version = libtpu or installed_libtpu()
        if version and _release(version) >= V7X_ESTIMATING_LIBTPU:
            return None  # cycles; no v7x clock here, so no seconds (``cycles_only``)
        needs = ".".join(str(x) for x in V7X_ESTIMATING_LIBTPU)
        return (f"{ESTIMATOR_REFUSALS['v7x']} (libtpu {version or 'not installed'}; "
                f"libtpu {needs} or newer, with jax 0.12 on Python 3.12, returns cycles)")
    if name in ESTIMATOR_REFUSALS:
        return ESTIMATOR_REFUSALS[name]
    return "not a TPU generation the estimator was tried on"


# Chips whose TensorCores JAX shows as separate devices (no megacore fusion): v7x's two
# cores are two devices, each with one core (see its entry above).
_CORES_ARE_DEVICES = frozenset({"v7x"})


def device_cores(chip: Chip) -> int:
    """TensorCores one JAX device of ``chip`` drives (``device.num_cores``): both of a
    megacore chip's (v4 and v5p fuse their two cores into one device, which is how a
    v4 or v5p VM presents them), one on a single-core chip (v5e, v6e) and on v7x, whose
    cores are devices of their own. Derived from the table, so the static analysis and
    the harness's abstract devices agree on every chip."""
    if chip.name in _CORES_ARE_DEVICES or not chip.megacore:
        return 1
    return chip.cores


def device_facts(name: str) -> tuple[str, int] | None:
    """(device kind, cores per device) of TPU chip ``name``; None for a chip JAX has no
    TPU device kind for (a GPU, the CPU, an unknown name)."""
    kind = DEVICE_KINDS.get(name)
    if kind is None or name not in CHIPS:
        return None
    return kind, device_cores(CHIPS[name])


def bound_by(chip: Chip, flops: float | None, bytes_moved: float | None,
             f32: bool) -> str | None:
    """``compute`` or ``memory``: which side of ``chip``'s ridge point a program with
    this much work per byte sits on (for f32 work, the f32 peak); None without both."""
    if not flops or not bytes_moved:
        return None
    peak = chip.f32_flops if f32 else chip.bf16_flops
    return "compute" if flops / bytes_moved >= peak / chip.hbm_bytes_per_s else "memory"


def get_chip(name: str) -> Chip:
    """Look a chip up by key, label or JAX ``device_kind``; raises ``KeyError`` naming the choices."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in CHIPS:
        return CHIPS[key]
    for chip in CHIPS.values():
        if chip.label.lower() == key:
            return chip
    raise KeyError(f"unknown chip {name!r}; choose one of: {', '.join(CHIPS)}")


def chip_for_device(platform: str, device_kind: str) -> Chip:
    """The chip a backend runs on (``KeyError`` for an accelerator not in the table)."""
    try:
        return get_chip(device_kind)
    except KeyError:
        pass
    kind = device_kind.lower()
    for key in ("h200", "h100"):
        if key in kind:
            return CHIPS[key]
    if platform == "cpu":
        return CHIPS["cpu"]
    # An unknown accelerator gets no made-up figures: the caller says so.
    raise KeyError(f"no chip entry for {platform} device {device_kind!r}; pass --chip")


def bound(flops: float | None, bytes_moved: float | None, chip: Chip,
          dtype: str = "bf16") -> dict[str, Any]:
    """Roofline: the time no kernel can beat for this work on ``chip``.

    The bound is max(flops / peak, bytes / bandwidth): a kernel must at least
    stream its operands through HBM once and issue its multiply-adds at peak rate.
    """
    peak = chip.peak_flops(dtype)
    compute_s = (flops or 0.0) / peak
    memory_s = (bytes_moved or 0.0) / chip.hbm_bytes_per_s
    time_s = max(compute_s, memory_s)
    intensity = (flops / bytes_moved) if flops and bytes_moved else None
    return {
        "chip": chip.name,
        "dtype": "f32" if dtype in ("f32", "float32") else "bf16",
        "flops": flops,
        "bytes": bytes_moved,
        "intensity": intensity,
        "ridge_intensity": peak / chip.hbm_bytes_per_s,
        "compute_bound_ms": compute_s * 1e3,
        "memory_bound_ms": memory_s * 1e3,
        "bound_ms": time_s * 1e3,
        "bound_by": "compute" if compute_s >= memory_s else "memory",
        "peak_estimated": chip.f32_estimated and dtype in ("f32", "float32"),
    }


def placement(roof: dict[str, Any], measured_ms: float | None) -> dict[str, Any]:
    """Where a measured run sits against its bound: fraction of roofline reached (<= 1)."""
    out = dict(roof)
    out["measured_ms"] = measured_ms
    if measured_ms and measured_ms > 0 and roof["bound_ms"] > 0:
        out["fraction"] = roof["bound_ms"] / measured_ms
        if roof["flops"]:
            out["achieved_flops"] = roof["flops"] / (measured_ms / 1e3)
        if roof["bytes"]:
            out["achieved_bytes_per_s"] = roof["bytes"] / (measured_ms / 1e3)
    else:
        out["fraction"] = None
    return out

# -- the block tiling rule, written once --------------------------------------------------
# A TPU vector register is 8 sublanes by 128 lanes (of 32-bit words). A ``pallas_call``
# block's last axis is laid along the lanes and the one before it along the sublanes, so
# the Mosaic lowering takes a block whose last two dims are each a multiple of that unit
# or equal to the whole array's dim (``tiles``). Types narrower than 32 bits pack along
# the sublanes: a bf16 tile is (16, 128), an int8 one (32, 128) (``tile_rows``). The task
# shapes (how far a check shape may shrink), the tunables (which block values may be
# proposed), the static analysis (whether a BlockSpec lowers) and the offline agent's fix
# for a misaligned block all read the rule from here.

LANE, SUBLANE = 128, 8


def tile_unit(axis_from_end: int) -> int:
    """The tile unit of an axis counted from the end (1: the last, lanes; 2: sublanes);
    other axes are free (1)."""
    return LANE if axis_from_end == 1 else SUBLANE if axis_from_end == 2 else 1


def tiles(block: int, full: int, unit_: int) -> bool:
    """Whether a block dim lowers: a multiple of its unit, or the array's whole dim."""
    return block == full or block % unit_ == 0


def misaligned(block: Sequence[int], shape: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """``(axis, block, array dim, unit)`` for each of a block's last two dims that breaks
    the rule (rank-2 and up; rank-1 blocks have a rule of their own in the static
    analysis)."""
    if len(block) < 2 or len(block) != len(shape):
        return []
    out = []
    for back in (2, 1):
        axis = len(block) - back
        if not tiles(block[axis], shape[axis], tile_unit(back)):
            out.append((axis, block[axis], shape[axis], tile_unit(back)))
    return out


def tile_rows(itemsize: int) -> int:
    """Sublanes a tile holds for a type of ``itemsize`` bytes: 8 for 32-bit types, 16
    for bf16, 32 for int8."""
    return SUBLANE * max(1, 4 // max(1, itemsize))
