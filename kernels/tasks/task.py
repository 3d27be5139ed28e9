"""The ``Task`` model shared by every layout, and its errors.

A task is loaded in the app process without importing JAX: loaders read TOML/YAML,
parse Python sources with ``ast`` to check that the required functions exist, and
produce a ``Task``. The task travels to a worker as ``Task.to_spec()`` (plain JSON),
where ``kernels.worker.runtime`` imports the reference and builds inputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Layout = Literal["native", "jaxbench", "maxkernel"]

# Entry-point name a candidate must define, per layout.
ENTRY_POINTS: dict[str, str] = {
    "native": "kernel",
    "jaxbench": "workload",
    "maxkernel": "computation",
}


class TaskError(Exception):
    """A task directory that cannot be used: says which file, where, and what is expected."""

    def __init__(self, path: Path | str, message: str, line: int | None = None,
                 expected: str | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.expected = expected
        self.detail = message
        where = f"{self.path}:{line}" if line else self.path
        text = f"{where}: {message}"
        if expected:
            text += f" (expected: {expected})"
        super().__init__(text)


class UnknownOverride(TaskError):
    """A ``--set KEY`` the task has no use for (no such parameter, CONFIG key or literal).

    Suite-wide overrides skip such keys for the tasks that lack them; any other
    ``TaskError`` from an override (a size that cannot be attributed) is a real error."""


@dataclass(frozen=True)
class ShapeConfig:
    """One named shape configuration of a task.

    ``params`` are the keyword arguments for the input builder (native:
    ``make_inputs(key, **params)``; JAXBench: CONFIG overrides; MaxKernel: the index
    into ``get_inputs()``'s list as ``{"index": i}``). ``size`` says where it runs:
    ``small`` configurations run on every host (CPU interpret mode included),
    ``large`` ones only on real hardware. A held-out configuration is used for
    correctness but never shown to an agent.
    """

    name: str
    params: dict[str, Any]
    size: Literal["small", "large"] = "small"
    held_out: bool = False
    atol: float | None = None  # per-configuration override of the task's tolerance
    rtol: float | None = None


@dataclass(frozen=True)
class Task:
    """A kernel task in any of the three layouts."""

    name: str
    root: Path
    layout: Layout
    description: str
    reference_path: Path  # reference.py or baseline.py
    shapes: tuple[ShapeConfig, ...]
    atol: float = 1e-5
    rtol: float = 1e-5
    require_pallas: bool = True
    family: str | None = None  # elementwise | rowwise | matmul | attention | ...
    kernel_path: Path | None = None  # starting candidate, if any
    input_gen_path: Path | None = None  # MaxKernel: where input_gen_code lives
    meta: dict[str, Any] = field(default_factory=dict)
    # The size the user runs (compile verdicts, estimates and rankings are for it);
    # ``shapes`` are the check shapes (correctness). ``--set`` shrinks the check shapes
    # only. Its params are for ``production_task()``, whose meta is ``production_meta``
    # when the layout keeps sizes outside the params (a JAXBench CONFIG as written).
    production: ShapeConfig | None = None
    production_meta: dict[str, Any] | None = None

    @property
    def entry(self) -> str:
        """Name of the function a candidate must define for this layout."""
        return ENTRY_POINTS[self.layout]

    def visible_shapes(self) -> tuple[ShapeConfig, ...]:
        """Shapes an agent may see: every configuration but the held-out one."""
        return tuple(s for s in self.shapes if not s.held_out)

    def shapes_for(self, platform: str) -> tuple[ShapeConfig, ...]:
        """Configurations meant for a host: small ones on CPU, all of them on hardware."""
        if platform == "cpu":
            return tuple(s for s in self.shapes if s.size == "small")
        return self.shapes

    def production_task(self) -> Task | None:
        """The task at its production shape: one configuration, no ``--set`` overrides
        (for JAXBench, CONFIG and the hard-coded sizes as written). A task without one
        (built by hand, not by a loader) runs at its largest visible check configuration
        (by the sum of its integer parameters), as docs/EVALUATION.md says; None only for
        a task with no configuration at all."""
        from dataclasses import replace

        if self.production is None:
            visible = [s for s in self.shapes if not s.held_out] or list(self.shapes)
            if not visible:
                return None
            largest = max(visible, key=lambda s: sum(
                v for v in s.params.values() if isinstance(v, int) and not isinstance(v, bool)))
            return replace(self, shapes=(largest,))
        meta = self.production_meta if self.production_meta is not None else self.meta
        return replace(self, shapes=(self.production,), meta=dict(meta), production=None,
                       production_meta=None)

    def production_is_check_shape(self) -> bool:
        """The production configuration is one of the check shapes, unchanged: what is
        checked is what is ranked."""
        return self.production is not None and self.production_meta is None and any(
            s == self.production for s in self.shapes)

    def reference_source(self) -> str:
        """The reference as it runs: for a JAXBench task whose ``--set`` overrides
        rewrote hard-coded sizes, the rewritten text (same lines)."""
        text = self.reference_path.read_text()
        rewrites = self.meta.get("literal_rewrites")
        if rewrites:
            from tilewright.kernels.source.literals import rewrite_numbers

            text = rewrite_numbers(text, rewrites)
        return text

    def starting_source(self) -> str | None:
        """The task's kernel.py; a symlink out of the task or an oversized file raises
        ``KernelFileError`` (a ValueError) with the reason."""
        from tilewright.kernels.source.files import read_kernel_file

        return read_kernel_file(self.kernel_path, (self.root,)) if self.kernel_path else None

    def to_spec(self) -> dict[str, Any]:
        """Plain-JSON description sent to a worker process."""
        spec = asdict(self)
        for key in ("root", "reference_path", "kernel_path", "input_gen_path"):
            if spec[key] is not None:
                spec[key] = str(spec[key])
        spec["shapes"] = [asdict(s) for s in self.shapes]
        spec["production"] = asdict(self.production) if self.production else None
        spec["entry"] = self.entry
        return spec

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Task:
        data = {k: v for k, v in spec.items() if k != "entry"}
        for key in ("root", "reference_path", "kernel_path", "input_gen_path"):
            if data.get(key) is not None:
                data[key] = Path(data[key])
        data["shapes"] = tuple(ShapeConfig(**s) for s in data["shapes"])
        if data.get("production"):
            data["production"] = ShapeConfig(**data["production"])
        return cls(**data)
