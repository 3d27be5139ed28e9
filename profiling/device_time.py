"""Device time of whole programs, read from a profile's device plane.

On a TPU, xprof's trace of a run has a ``/device:TPU:N`` process whose ``XLA Modules``
line holds one event per execution of a compiled program, named after the jitted
function (``jit_<name>(<id>)``), with its duration on the chip: host dispatch is not in
it (about 0.5 ms a call on a v5e, which misranks every kernel under a few
milliseconds when calls are timed one by one). The judge names what it times
(``tw_candidate``, ``tw_reference``) and reads their executions here. Pure Python: the
trace is read by ``profiling.convert``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewright.profiling.timeline import Timeline


@dataclass(frozen=True)
class ProgramTimes:
    """One named program's executions on the device: durations in microseconds, and
    the device plane they were read from."""

    name: str
    durations_us: tuple[float, ...]
    device: str

    @property
    def count(self) -> int:
        return len(self.durations_us)


def module_prefixes(name: str) -> tuple[str, ...]:
    """How XLA names a jitted function's program: ``jit_name`` (and ``jit(name)``)."""
    return (f"jit_{name}", f"jit({name})")


def program_times(timeline: Timeline, name: str) -> ProgramTimes | None:
    """The executions of the program jitted as ``name`` on the first device that ran
    it, from its module line; None when the profile has no device plane or the
    program never ran on one (a CPU host: its programs run on host threads)."""
    prefixes = module_prefixes(name)
    for track in timeline.tracks_of("device_modules"):
        found = tuple(e.dur_us for e in track.events if e.name.startswith(prefixes))
        if found:
            return ProgramTimes(name, found, track.process)
    return None


Plane = tuple[str, str, list[tuple[str, float]]]  # (plane, line, [(event, duration µs)])


def program_times_in_planes(planes: list[Plane], name: str) -> ProgramTimes | None:
    """As ``program_times``, from an XSpace's planes read directly (``jax.profiler.
    ProfileData``: no xprof needed): the ``XLA Modules`` line of a ``/device:`` plane."""
    prefixes = module_prefixes(name)
    for plane, line, events in planes:
        if not plane.startswith("/device:") or line.strip().lower() != "xla modules":
            continue
        found = tuple(d for n, d in events if n.startswith(prefixes))
        if found:
            return ProgramTimes(name, found, plane)
    return None


def what_planes_hold(planes: list[Plane]) -> str:
    """A short account of a trace's device planes, for a message saying why a program
    was not found there: each plane's lines, and the first module names."""
    devices = [(p, line, events) for p, line, events in planes if p.startswith("/device:")]
    if not devices:
        return "no /device: plane: no accelerator ran these programs"
    said = []
    for plane, line, events in devices[:6]:
        names = sorted({n for n, _ in events})[:3]
        said.append(f"{plane} {line!r}: {len(events)} events {names}")
    return "; ".join(said)


def one_program_twice(kernel: ProgramTimes | None, ref: ProgramTimes | None,
                      n: int) -> tuple[ProgramTimes | None, ProgramTimes | None]:
    """When the candidate is the reference's own program (a baseline submitted as its
    kernel), XLA compiles it once and the device plane names every execution after the
    first jitted name: 2n executions of ``tw_candidate`` and none of ``tw_reference``
    (JAXBench's baselines on the v5e). The calls were issued n of the kernel, then n of
    the reference, so the first n are the kernel's and the last n the reference's."""
    if kernel is None or ref is not None or kernel.count < 2 * n:
        return kernel, ref
    times = kernel.durations_us[-2 * n:]
    return (ProgramTimes(kernel.name, times[:n], kernel.device),
            ProgramTimes(kernel.name, times[n:], kernel.device))
