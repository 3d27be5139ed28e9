"""The offline autotuner: one tunable change per proposal, remembered through the history.

The search space is the kernel's declared ``TUNABLES`` filtered for TPU legality
(``kernels.source.tunables``): aligned to (8, 128), and dividing the array dims a tunable tiles
(matched by name against the visible shapes' parameters) unless it covers them whole.
What was measured comes from the request: every history entry with ``tunables`` (and a
``rank``, else ``median_ms``) plus the current version's last evaluation, so a resumed
session continues where it stopped. Configurations are ordered by the one ordering,
``Rank.key`` (off a TPU: the kernel's own time at the production shape as the TPU
compiler estimates it, never a host simulation ratio while a compiler figure exists).
Failed configurations rank below everything, so the search never proposes them again.

The strategy is coordinate search with bisection, seeded at the best configuration so
far and biased towards larger blocks: per tunable, the first probe jumps to the largest
legal value (fewer grid steps, each of which costs fixed pipeline overhead; the largest
block that still fits VMEM usually wins on a TPU, and interpret mode is dominated by the
step count), then halves the interval between the best value and the nearest measured
worse one, assuming the time along one tunable is unimodal. Only when no larger value
is left anywhere does it step to smaller values. A kernel with k tunables of n choices
each needs about k * log2(n) evaluations instead of the grid's n ** k. A switch
(``TUNABLE_SWITCHES``: a choice of how to compute, not a size) is no axis to bisect:
each of its values is measured once, from the best configuration then, before any block
is bisected, and afterwards it stays at the best one's value (measured on a v5e at the
production shapes, 3 MXU passes per float32 product instead of 6 took causal_attention,
4x32x4096x128, from 1.59x to 2.73x of XLA and matmul_bias_gelu, 4096x4096 @ 4096x14336,
from 1.06x to 2.09x).
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tilewright.agents.base import VersionRow
from tilewright.agents.offline.constraints import allowed, constrain
from tilewright.kernels.judge.rank import Rank, best_of, ranking
from tilewright.kernels.source import tunables
from tilewright.profiling.diagnose import VMEM_PRESSURE

Config = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Step:
    """The next configuration to measure, as a change to the current source."""

    changes: dict[str, Any]  # relative to the version it applies to (``base``)
    config: dict[str, Any]
    summary: str
    rationale: str
    # The version the change applies to when it is not the current one: the best version
    # so far, whose configuration the step starts from. Its "A -> B" is read from that
    # version, so the title says what the diff against it shows.
    base: int | None = None


def _parent(obs: Observations, best: tuple[Config, Score] | None,
            current: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The configuration a step starting from ``best`` is applied to, and its version:
    the best version's own when it differs from the current kernel's (and its version is
    known), else the current kernel's (version None: the current one)."""
    if best is not None and dict(best[0]) != current:
        version = obs.version.get(best[0])
        if isinstance(version, int):
            return dict(best[0]), version
    return dict(current), None


def _from(base: int | None) -> str:
    return f" on v{base}" if base is not None else ""


def config_key(config: dict[str, Any]) -> Config:
    return tuple(sorted(config.items()))


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) and not isinstance(value, bool) else (1, str(value))


# How a configuration scores (larger is better): ``Rank.key`` of its evaluation; a
# correct run without a ranking number by its time (below every ranking number); a
# failed or rejected one below everything.
Score = tuple[float, ...]
FAILED: Score = (-math.inf,)


def score(status: str | None, rank: Rank | None, median_ms: float | None) -> Score | None:
    """A run's score (None: correct but neither ranked nor timed, which says nothing)."""
    if status != "correct":
        return FAILED
    if rank is not None and rank.ranked:
        return rank.key()
    if isinstance(median_ms, int | float) and not isinstance(median_ms, bool) \
            and median_ms > 0:
        return (0.0, 1.0, -float(median_ms), 0.0)
    return None


class Observations:
    """Each measured configuration's score (``score``: larger is better), the version
    it was measured as and its ``Rank``; ``score`` holds every configuration tried."""

    def __init__(self) -> None:
        self.score: dict[Config, Score] = {}
        self.version: dict[Config, int | None] = {}
        self.rank: dict[Config, Rank | None] = {}
        # configurations never run because they are a measured version's program (its
        # score is theirs): measured points, never the base a step starts from
        self.aliases: set[Config] = set()

    def said(self, key: Config) -> str | None:
        """How the configuration's number reads (``Rank.words``: "est. 1.34x on v5e
        (TPU compiler)"); None when unmeasured or unranked."""
        rank = self.rank.get(key)
        return rank.words() if rank is not None and rank.ranked else None

    def add(self, config: dict[str, Any], status: str | None, rank: Rank | None = None,
            median_ms: float | None = None, version: int | None = None) -> None:
        key = config_key(config)
        found = score(status, rank, median_ms)
        if found is None:
            return  # correct but not timed: says nothing about speed
        if key not in self.score or found > self.score[key]:
            self.score[key] = found
            self.version[key] = version
            self.rank[key] = rank if found != FAILED else None

    def alias(self, config: dict[str, Any], of: dict[str, Any]) -> None:
        """``config`` is the program ``of`` was (measured), at the production shape."""
        key, known = config_key(config), config_key(of)
        if key not in self.score and known in self.score:
            self.score[key], self.version[key] = self.score[known], self.version[known]
            self.rank[key] = self.rank[known]
            self.aliases.add(key)

    def best(self) -> tuple[Config, Score] | None:
        ranked = [(k, s) for k, s in self.score.items() if s != FAILED
                  and k not in self.aliases]
        if not ranked:
            return None
        # the highest score, the first measured on ties; among ranked configurations the
        # one rule of "best" (best_of: the least VMEM among estimates within a percent)
        top = max(ranked, key=lambda ks: ks[1])
        if self.rank.get(top[0]) is None:
            return top
        chosen = best_of((k for k, _s in ranked if self.rank.get(k) is not None),
                         self.rank.get)
        return (chosen, self.score[chosen]) if chosen is not None else top


def observations_from(request_history: tuple[VersionRow, ...], current_source: str | None,
                      last_eval: dict[str, Any] | None, names: set[str],
                      current_version: int | None = None) -> Observations:
    obs = Observations()
    for entry in request_history:
        config = entry.tunables
        if config is None or set(config) != names:
            continue
        obs.add(config, entry.status, entry.rank, entry.median_ms, entry.version)
    if current_source is not None and last_eval:
        timing = last_eval.get("timing") or {}
        # what ranks it (kernels.judge.rank.ranking): off-TPU the TPU compiler's figures,
        # never the interpreter's time while a compiler figure exists
        obs.add(tunables.config_of(current_source), last_eval.get("status"),
                ranking(last_eval), timing.get("median_ms"), current_version)
    return obs


def tiled_dims(names: list[str], shapes: tuple[dict[str, Any], ...]) -> dict[str, tuple[int, ...]]:
    """The array dims each tunable tiles, over every visible shape, matched by name:
    ``BLOCK_K`` tiles shape parameter ``k``, ``BLOCK_ROWS`` tiles ``rows``, ``BLOCK_Q``
    tiles ``q`` (or ``seq``, for attention). Unmatched tunables get no dims."""
    out: dict[str, tuple[int, ...]] = {}
    for name in names:
        stem = name.upper().removeprefix("BLOCK_").removeprefix("TILE_").lower()
        keys = [stem, stem.rstrip("s"), stem + "s"]
        if stem in ("q", "kv"):
            keys.append("seq")
        dims = []
        for shape in shapes:
            params = shape.get("params", {})
            key = next((k for k in keys if isinstance(params.get(k), int)), None)
            if key is not None:
                dims.append(int(params[key]))
        if dims:
            out[name] = tuple(sorted(set(dims)))
    return out


class VmemModel:
    """Whether a configuration's blocks fit the chip's scoped VMEM at the production
    shape, scaled from one the TPU compiler measured there: a block's bytes grow with the
    product of its tiling tunables (each clamped to the largest dim it tiles), so
    ``vmem(config) ~= vmem(measured) x prod(min(v, dim) / min(v0, dim))``. A model, not a
    verdict: the compile at the production shape still decides; it spares an evaluation
    that would only say "does not fit"."""

    def __init__(self, measured: dict[str, Any], vmem_bytes: float, limit_bytes: float,
                 dims: dict[str, tuple[int, ...]], switches: Iterable[str] = ()) -> None:
        self.measured, self.vmem, self.limit, self.dims = measured, vmem_bytes, limit_bytes, dims
        self.switches = frozenset(switches)  # they size no block

    def bytes_for(self, config: dict[str, Any]) -> float:
        """The model's VMEM for ``config``. A tunable whose dims are not known (its name
        matches no shape parameter: ``x_0`` of a task made from a function) is taken to
        tile an array larger than any of its values: its bytes grow with it."""
        ratio = 1.0
        for name, value in config.items():
            if name in self.switches:
                continue
            old, dims = self.measured.get(name), self.dims.get(name)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                       for v in (value, old)):
                continue
            top = max(dims) if dims else max(value, old)
            ratio *= min(value, top) / min(old, top)
        return self.vmem * ratio

    def fits(self, config: dict[str, Any]) -> bool:
        return self.bytes_for(config) <= self.limit


def vmem_cap(source: str | None, chip: str | None) -> int | None:
    """The VMEM a kernel that sizes its own scoped limit may grow to: its ``VMEM_CAP``
    (the offline templates ask the compiler for what their blocks need,
    ``vmem_limit_bytes``, up to it), within the chip's own VMEM per core. None for a
    kernel that declares no cap: it lives within the limit its compile reported."""
    if not source:
        return None
    cap = _module_int(source, "VMEM_CAP")
    if cap is None:
        return None
    from tilewright.profiling.chips import get_chip

    try:
        capacity = get_chip(chip).vmem_bytes if chip and chip != "cpu" else None
    except KeyError:
        capacity = None
    return min(cap, capacity) if capacity else cap


def _module_int(source: str, name: str) -> int | None:
    """A module-level ``NAME = <int literal>``, or None."""
    try:
        nodes = tunables.module_assigns(ast.parse(source)).get(name) or []
        value = ast.literal_eval(nodes[-1].value) if nodes else None
    except (SyntaxError, ValueError):
        return None
    return value if type(value) is int else None


def vmem_model(history: tuple[VersionRow, ...], last_eval: dict[str, Any] | None,
               current_source: str | None, dims: dict[str, tuple[int, ...]],
               chip: str | None = None) -> VmemModel | None:
    """A ``VmemModel`` from the newest evaluation that has the compiler's VMEM figure at
    the production shape and the tunables it ran with; None when none has. Its limit is
    the scoped limit that compile reported, or, for a kernel that raises its own limit
    as its blocks grow (``vmem_cap``), that cap on ``chip``."""
    cap = vmem_cap(current_source, chip)
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for entry in history:
        if entry.tunables is not None:
            found.append((entry.tunables, entry.numbers))
    if last_eval and current_source is not None:
        tpu = last_eval.get("tpu") or {}
        found.append((tunables.config_of(current_source),
                      {"vmem_bytes": tpu.get("vmem_bytes"),
                       "vmem_limit_bytes": tpu.get("vmem_limit_bytes"),
                       "compile": tpu.get("compile")}))
    names = set(tunables.config_of(current_source)) if current_source else None
    switches = tunables.switches(current_source) if current_source else ()
    for config, numbers in reversed(found):
        if names is not None and set(config) != names:
            continue  # another kernel's tunables: its VMEM says nothing of this one
        vmem, limit = numbers.get("vmem_bytes"), numbers.get("vmem_limit_bytes")
        if numbers.get("compile") == "ok" and isinstance(vmem, int | float) and vmem > 0 \
                and isinstance(limit, int | float) and limit > 0 and config:
            return VmemModel(dict(config), float(vmem), float(max(limit, cap or 0)), dims,
                             switches)
    return None


def covering(rows: Iterable[tuple[dict[str, Any], list[list[int]] | None]], names: set[str]
             ) -> dict[str, int]:
    """Per tunable, the least value measured to cover every grid axis it tiles at the
    production shape: two measured configurations differing in that tunable alone, whose
    production grids differ on some axes, the larger of them with extent 1 on all of
    those. A block that covers its axes leaves no grid step to save: larger values run
    as the same kernel (clamped to the dim) or a padded one. (18k's convolution: 64 and
    128 rows measured, grids (128, 2) and (128, 1) for its 126 output rows; the search
    then spent two of its four evaluations on 256 and 512, both the 126-row kernel.)
    ``rows``: (configuration, grids of its pallas_calls) of each measured version."""
    kept = [(dict(c), g) for c, g in rows if set(c) == names and g]
    found: dict[str, int] = {}
    for (a, ga), (b, gb) in itertools.combinations(kept, 2):
        moved = [n for n in names if a[n] != b[n]]
        if len(moved) != 1 or not all(type(c[moved[0]]) is int for c in (a, b)):
            continue
        name = moved[0]
        (_, glo), (hi, ghi) = sorted(((a, ga), (b, gb)), key=lambda pair: pair[0][name])
        if len(glo) != len(ghi) or any(len(x) != len(y) for x, y in zip(glo, ghi, strict=True)):
            continue
        axes = [(i, j) for i, (x, y) in enumerate(zip(glo, ghi, strict=True))
                for j in range(len(x)) if x[j] != y[j]]
        if axes and all(ghi[i][j] == 1 for i, j in axes):
            found[name] = min(found.get(name, hi[name]), hi[name])
    return found


def held(current: dict[str, Any], pending: Iterable[dict[str, Any]]) -> set[str]:
    """Integer tunables that a configuration not yet measured (a child of ``current``
    still to run, or running) moves alone from ``current``: its production grid, once
    known, says whether ``current``'s block already covers its axes (``covering``), so
    no larger value of them until then; a smaller one changes the grid and may go ahead.
    (18k's search ran 256 rows beside 64 from the 128-row kernel: 256 ran as the 126-row
    kernel of 128 again, which 64's grid would have shown.)"""
    names: set[str] = set()
    for config in pending:
        if set(config) != set(current):
            continue
        moved = [n for n in current if config[n] != current[n]]
        if len(moved) == 1 and type(current[moved[0]]) is int \
                and type(config[moved[0]]) is int:
            names.add(moved[0])
    return names


def within_cover(space: dict[str, list[Any]], covered: dict[str, int] | None
                 ) -> dict[str, list[Any]]:
    """``space`` without the values above the one that covers a tunable's grid axes."""
    if not covered:
        return space
    return {name: [v for v in values if name not in covered
                   or not (type(v) is int and v > covered[name])]
            for name, values in space.items()}


def search_space(source: str, dims: dict[str, tuple[int, ...]] | None = None
                 ) -> dict[str, list[Any]]:
    """Legal values per tunable: TPU-aligned, and dividing (or covering) the dims it tiles."""
    legal = tunables.legal_choices(source, dims)
    return {name: _one_clamped(sorted(set(values), key=_sort_key), (dims or {}).get(name, ()))
            for name, values in legal.items() if values}


def _one_clamped(values: list[Any], dims: tuple[int, ...]) -> list[Any]:
    """Blocks at least as large as every dim they tile all clamp to the whole dim: the
    same kernel. Keep the smallest of them, so a shape made small (``--set rows=64``)
    does not spend evaluations on 128, 256 and 512 rows that all run as 64."""
    if not dims:
        return values
    top = max(dims)
    over = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= top]
    return [v for v in values if v not in over or v == min(over)] if len(over) > 1 else values


def next_step(source: str, obs: Observations,
              dims: dict[str, tuple[int, ...]] | None = None,
              constraints: dict[str, list[tuple[str, int]]] | None = None,
              vmem: VmemModel | None = None, covered: dict[str, int] | None = None
              ) -> Step | None:
    """The next configuration to try, or None when every neighbour of the best is measured.
    ``constraints`` (``constraints_from_notes``) keep the search inside what the
    person's rejection notes allow; ``covered`` (``covering``) leaves out blocks larger
    than the one measured to cover their grid axes."""
    space = within_cover(constrain(search_space(source, dims), constraints or {}), covered)
    if not space:
        return None
    current = tunables.config_of(source)
    best = obs.best()
    if best is not None and not all(allowed(v, (constraints or {}).get(k, []))
                                    for k, v in best[0]):
        best = None  # the best so far is what a note ruled out: search from the current
    base = dict(best[0]) if best else dict(current)
    # Declared order, and a legal value for every tunable (the current one if need be).
    base = {n: (base.get(n) if base.get(n) in values else current[n])
            for n, values in space.items()}
    moved = {}
    for name, values in space.items():
        if base[name] not in values and isinstance(base[name], int) and constraints \
                and name in constraints:
            numeric = [v for v in values if isinstance(v, int)]
            if numeric:
                moved[name] = min(numeric, key=lambda v: (abs(v - base[name]), v))
    parent, parent_version = _parent(obs, best, current)
    if moved:  # a note rules the current value out: go to the nearest value it allows
        config = {**base, **moved}
        if config_key(config) not in obs.score:
            changes = {k: v for k, v in config.items() if parent.get(k) != v}
            name = next(iter(moved))
            full = " ".join(f"{k}={v}" for k, v in config.items())
            return Step(changes, config, f"tune {name} {parent.get(name)} -> {moved[name]}"
                        f"{_from(parent_version)} ({full})",
                        "Your rejection note rules out the current "
                        + ", ".join(f"{k}={base[k]}" for k in moved) + "; this moves "
                        + ", ".join(f"{k} to {v}" for k, v in moved.items())
                        + ", the nearest value the note allows.", parent_version)
        base = config
    switches = tunables.switches(source)
    declared = tunables.read(source)
    probes = [_switch_probe(declared[name][1], space, obs, base, name) for name in switches
              if name in space]
    probes += [_probe(space, obs, base, name, up=True) for name in space if name not in switches]
    probes += [_probe(space, obs, base, name, up=False) for name in space
               if name not in switches]
    for probe in probes:
        if probe is None:
            continue
        name, value, why = probe
        config = {**base, name: value}
        if vmem is not None and not vmem.fits(config):
            continue  # would not fit VMEM at the production shape: not worth a run
        changes = {k: v for k, v in config.items() if parent.get(k) != v}
        rationale = _rationale(name, base, value, why, best, obs, current)
        if constraints:
            rationale += " It stays within what your rejection notes allow (" + "; ".join(
                f"{n} {op} {v}" for n, bounds in constraints.items() for op, v in bounds) + ")."
        return Step(changes, config, _summary(name, parent.get(name), value, config,
                                              parent_version), rationale, parent_version)
    return None


def _switch_probe(declared: list[Any], space: dict[str, list[Any]], obs: Observations,
                  base: dict[str, Any], name: str) -> tuple[str, Any, str] | None:
    """A switch's first value, in its declared order, that no configuration measured so
    far has: each value is measured once, from ``base``."""
    seen = {dict(key).get(name) for key in obs.score}
    for value in declared:
        if value in space[name] and value not in seen and value != base[name]:
            return name, value, "switch"
    return None


def _probe(space: dict[str, list[Any]], obs: Observations, base: dict[str, Any], name: str,
           up: bool) -> tuple[str, Any, str] | None:
    values = space[name]
    if base[name] not in values or len(values) < 2:
        return None
    b = values.index(base[name])
    measured = {i for i, v in enumerate(values) if config_key({**base, name: v}) in obs.score}
    measured.add(b)
    if up:
        above = [i for i in measured if i > b]
        if not above:
            if b == len(values) - 1:
                return None
            return name, values[-1], "largest"
        u = min(above)
        if u - b > 1:
            return name, values[(b + u) // 2], f"between:{values[u]}"
        return None
    below = [i for i in measured if i < b]
    if not below:
        return (name, values[b - 1], "smaller") if b > 0 else None
    d = max(below)
    if b - d > 1:
        return name, values[(b + d + 1) // 2], f"between:{values[d]}"
    return None


def _summary(name: str, old: Any, new: Any, config: dict[str, Any],
             base: int | None = None) -> str:
    """"tune BLOCK_ROWS 128 -> 64 (BLOCK_ROWS=64 BLOCK_COLS=256)": ``old`` is the value in
    the version the change applies to (" on v3" when that is not the current one)."""
    full = " ".join(f"{k}={v}" for k, v in config.items())
    return f"tune {name} {old} -> {new}{_from(base)} ({full})"


def _rationale(name: str, base: dict[str, Any], value: Any, why: str,
               best: tuple[Config, Score] | None, obs: Observations,
               current: dict[str, Any]) -> str:
    parts = []
    if best is not None and dict(best[0]) != current:
        version = obs.version.get(best[0])
        said = obs.said(best[0])
        label = f"v{version}" if version else "the best version so far"
        parts.append(f"Starting from the best configuration measured so far ({label}"
                     f"{f', {said}' if said else ''}) rather than the current kernel"
                     + (f": the change applies to v{version}, and the new version is its "
                        "child." if isinstance(version, int) else "."))
    if why == "switch":
        parts.append(f"{name} chooses how the kernel computes, not a block size: each of its "
                     f"values is measured once, from the best configuration so far ({name}="
                     f"{value} not yet), before block sizes are bisected.")
    elif why == "largest":
        parts.append(f"No larger {name} has been measured yet: jump to the largest legal value, "
                     f"{value}. Larger blocks mean fewer grid steps, and each step pays a fixed "
                     "pipeline overhead (about 0.35 us on a TPU, much more in interpret mode); "
                     "if it is slower or does not fit VMEM, the next step bisects back.")
    elif why.startswith("between:"):
        other = why.split(":", 1)[1]
        parts.append(f"{name}={other} was measured worse than {base[name]}: bisect between "
                     f"them and try {value}, assuming time along {name} is unimodal.")
    else:
        parts.append(f"Every larger value of every tunable has been tried around the best "
                     f"configuration; step {name} down to {value} (smaller blocks use less VMEM "
                     "and give more parallel grid steps).")
    tried = sum(1 for c in obs.score.values())
    parts.append(f"{tried} configuration(s) measured so far; the others stay as they are.")
    return " ".join(parts)


# What a diagnosis (profiling.diagnose) asks of the block sizes: grow them all, or shrink.
_DIAGNOSED_MOVES = {"per_step_overhead": "grow", "memory_bound": "grow",
                    "vmem_pressure": "shrink"}


def diagnosed_step(source: str, obs: Observations, dims: dict[str, tuple[int, ...]] | None,
                   diagnosis: dict[str, Any] | None,
                   constraints: dict[str, list[tuple[str, int]]] | None = None,
                   vmem: VmemModel | None = None, covered: dict[str, int] | None = None
                   ) -> Step | None:
    """The move a diagnosis of the best version calls for, made on every tunable at once
    (one evaluation instead of one per tunable): per-step overhead or memory-bound ->
    the largest legal blocks; VMEM pressure -> one notch smaller each. None when there
    is no such diagnosis, it is about another version, or that configuration was tried."""
    if not diagnosis:
        return None
    move = _DIAGNOSED_MOVES.get(str(diagnosis.get("kind")))
    best = obs.best()
    if move is None or best is None:
        return None
    if move == "grow" and "per_step_overhead" in (diagnosis.get("contradicted") or ()):
        return None  # the estimator says fewer, larger steps were slower here
    if diagnosis.get("version") is not None and obs.version.get(best[0]) not in (
            None, diagnosis.get("version")):
        return None  # the diagnosis describes a version that is no longer the best
    space = within_cover(constrain(search_space(source, dims), constraints or {}), covered)
    base = dict(best[0])
    if not space or set(base) != set(space):
        return None
    if move == "shrink" and vmem is not None and _module_int(source, "VMEM_CAP") is not None \
            and vmem.bytes_for(base) < VMEM_PRESSURE * vmem.limit:
        # A kernel that sizes its own scoped limit (VMEM_CAP) near-fills the limit it asks
        # for by design: "pressure" against that limit is not a wall, the cap is. (A v5e
        # search of 20k, 4096x8192 @ 8192x8192 bf16, shrank 512x1024x1024 blocks at 13 of
        # 64 MiB in three of seven evaluations.)
        return None
    config = {}
    switches = tunables.switches(source)
    for name, values in space.items():
        i = values.index(base[name]) if base[name] in values else 0
        config[name] = (base[name] if name in switches else
                        values[-1] if move == "grow" else values[max(0, i - 1)])
    fitted = ""
    if move == "grow" and vmem is not None:
        # The largest blocks that still fit VMEM at the production shape: step the
        # tunable furthest above its base down a notch until the model says they fit.
        while not vmem.fits(config):
            above = [n for n, values in space.items() if n not in switches
                     and values.index(config[n]) > (
                values.index(base[n]) if base[n] in values else 0)]
            if not above:
                return None
            name = max(above, key=lambda n: space[n].index(config[n])
                       - (space[n].index(base[n]) if base[n] in space[n] else 0))
            config[name] = space[name][space[name].index(config[name]) - 1]
        fitted = (f" (about {vmem.bytes_for(config) / 2**20:.1f} of "
                  f"{vmem.limit / 2**20:.0f} MiB of VMEM at the production shape)")
    if config == base or config_key(config) in obs.score:
        return None
    current = tunables.config_of(source)
    parent, parent_version = _parent(obs, best, current)
    changes = {k: v for k, v in config.items() if parent.get(k) != v}
    verb = ("largest legal blocks that fit VMEM" if move == "grow" and vmem is not None
            else "largest legal blocks" if move == "grow" else "one notch smaller blocks")
    said = str(diagnosis.get("summary") or "").rstrip()
    said = said if said.endswith((".", "!", "?")) else said + "."
    bounded = ""
    if constraints:
        bounded = " Within what your rejection notes allow (" + "; ".join(
            f"{name} {op} {value}" for name, bounds in constraints.items()
            for op, value in bounds) + ")."
    moves = ", ".join(f"{k} {parent.get(k)} -> {v}" for k, v in changes.items())
    return Step(changes, config, f"tune {moves}{_from(parent_version)} ({verb}, from the "
                "diagnosis)",
                f"The profile of v{diagnosis.get('version')} says {said} "
                f"So every tunable moves at once to its {verb}{fitted} from the best "
                "configuration "
                "measured so far; if that is not better, the coordinate search continues "
                f"from the best one.{bounded}", parent_version)
