"""``tilewright new``: a native task from a function in the user's code, or from a
JAXBench or MaxKernel task.

    tilewright new NAME --from model.py:fused_ln --shape x=f32[4096,1024] \\
        --shape w=f32[1024] [--arg eps=1e-6] [--check x_0=256] [--kernel mine.py:fn]
    tilewright new --from model.py:fused_ln --example model.py:example_inputs
    tilewright new NAME --from path/to/jaxbench_or_maxkernel_task [--set K=V]

NAME defaults to the function's (or the task directory's) name; the task is written
to ``./NAME`` (``-o DIR`` elsewhere). The layouts are in ``kernels.tasks.new`` (from a
function) and ``kernels.tasks.convert`` (from a benchmark task). After writing, the
task is loaded like any task and a worker builds its inputs and traces its reference
at every shape (``--no-check`` skips the worker). Exit 0 when the task is written and
checked, 1 when the worker found a problem (the files stay, to be fixed), 2 for bad
usage. App side: no JAX.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "new", help="write a task from a function in your code (or a JAXBench/MaxKernel task)",
        description="Write a native task directory from FILE.py:FUNCTION and the shapes you "
                    "run it at (the production shape; small check shapes are derived), or "
                    "convert a JAXBench or MaxKernel task directory to the native layout.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="shapes: NAME=DTYPE[DIMS], e.g. x=f32[4096,1024], w=bf16[k=1024,n=4096], "
               "b=f32[n], ids=i32[4096]:0..vocab, s=f32[]\n"
               "  equal numbers are one size (they shrink together); name sizes to keep "
               "them apart.\n"
               "examples:\n"
               "  tilewright new fused_ln --from model.py:fused_ln --shape x=f32[4096,1024] "
               "--shape res=f32[4096,1024] --shape gamma=f32[1024] --shape beta=f32[1024]\n"
               "  tilewright new --from model.py:fused_ln --example model.py:example_inputs\n"
               "  tilewright new gemm --from JAXBench/benchmark/gemm")
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help="task name (default: the function's or the directory's name)")
    parser.add_argument("--from", dest="source", metavar="FILE.py:FUNCTION|TASK_DIR",
                        help="the function to make a task of, or a JAXBench/MaxKernel task")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=DTYPE[DIMS]",
                        help="an array argument at the size you run it (repeatable)")
    parser.add_argument("--example", metavar="FILE.py:FUNCTION",
                        help="a function returning example inputs (a tuple, or a dict by "
                             "parameter name): their shapes and dtypes are used")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="a non-array argument, bound when the reference is called")
    parser.add_argument("--check", action="append", default=[], metavar="SIZE=N",
                        help="a check-shape size instead of the derived one (repeatable); "
                             "for a benchmark task, a --set KEY=VALUE for its check shape")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="benchmark task: the production size (default: as written)")
    parser.add_argument("--kernel", metavar="FILE.py[:FUNCTION]",
                        help="a starting kernel, copied to kernel.py")
    parser.add_argument("--family", help="elementwise | rowwise | matmul | attention | ...")
    parser.add_argument("--description", help="one paragraph for people and agents")
    parser.add_argument("-o", "--out", metavar="DIR", help="task directory (default: ./NAME)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    parser.add_argument("--no-check", action="store_true",
                        help="do not start a worker to build inputs and trace the reference")
    parser.add_argument("--keep-broken", action="store_true",
                        help="keep the task even when its reference fails in the worker "
                             "(default: nothing is left behind)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tilewright.kernels.tasks.new import NewTaskError

    if args.source is None and args.name and (":" in args.name or Path(args.name).is_dir()):
        args.source, args.name = args.name, None  # `tilewright new model.py:fn --shape ...`
    if args.source is None:
        return _usage("give --from FILE.py:FUNCTION (with --shape or --example) or --from "
                      "TASK_DIR", "e.g. tilewright new --from model.py:fused_ln --shape "
                      "x=f32[4096,1024]", args.json)
    source = Path(args.source).expanduser()
    name = args.name or (source.name if source.is_dir() else args.source.rpartition(":")[2])
    existed = _destination(args, name).exists()
    try:
        if Path(args.source).expanduser().is_dir():
            summary = _from_benchmark(args)
        else:
            summary = _function_task(args, split=True)
    except NewTaskError as exc:
        return _usage(str(exc), exc.next_step, args.json)
    if not args.no_check:
        summary["check"] = _check(Path(summary["directory"]))
        if not summary["check"].get("ok") and summary.get("_split"):
            # The reference needs some axes equal (a square matmul x @ x): one name again.
            args.force = True
            try:
                summary = _function_task(args, split=False)
            except NewTaskError as exc:
                return _usage(str(exc), exc.next_step, args.json)
            summary["check"] = _check(Path(summary["directory"]))
            summary.setdefault("notes", []).append(
                "equal sizes share one name: the reference did not run with each axis of "
                "its own size (a square input it needs square), so those check sizes stay "
                "equal")
        if not summary["check"].get("ok") and not args.keep_broken:
            summary["removed"] = _remove(Path(summary["directory"]), existed)
    summary.pop("_made", None)
    summary.pop("_split", None)
    return _report(summary, args.json)


def _function_task(args: argparse.Namespace, split: bool) -> dict[str, Any]:
    """The task from a function, with its integer inputs noted and its check shapes
    fitted to the user's kernel."""
    summary = _from_function(args, split)
    _note_integer_inputs(summary)
    if args.kernel and not args.no_check:
        _fit_to_kernel(args, summary)
    return summary


def _note_integer_inputs(summary: dict[str, Any]) -> None:
    """Integer inputs get random values: say so where their values decide the work (a
    grouped matmul's group sizes: the kernel's loops are estimated with the values the
    task's make_inputs gives at the production shape)."""
    from tilewright.kernels.tasks.shapes import DEFAULT_INT_RANGE

    made = summary.get("_made") or {}
    shapes = made.get("shapes")
    for spec in getattr(shapes, "inputs", ()):
        if not str(spec.dtype).startswith(("int", "uint")) or spec.low is not None \
                or spec.high is not None:
            continue
        low, high = DEFAULT_INT_RANGE
        summary.setdefault("notes", []).append(
            f"{spec.name} ({spec.dtype}) gets random values in [{low}, {high}) at every "
            "shape; where they decide the work (group sizes, lengths: a kernel's loops are "
            "estimated with the values at the production shape), write the values you run "
            "into reference.py's make_inputs")


def _remove(directory: Path, existed: bool) -> bool:
    """A task whose reference fails is not left behind (``--keep-broken`` keeps it):
    the directory goes when ``new`` made it, else only the files it wrote."""
    import shutil

    if not existed:
        shutil.rmtree(directory, ignore_errors=True)
        return True
    return False


def _fit_to_kernel(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    """Check shapes the user's kernel can run: its blocks at the production shape (the
    static analysis of its ``pallas_call``s, traced from the inputs' shapes in a worker's
    candidate process) decide which sizes the check shapes stay whole multiples of. The
    task is written again when that changes them; ``summary["shrunk"]`` says why each
    check size is what it is."""
    from tilewright.kernels.tasks import new as nt
    from tilewright.kernels.tasks.loaders import load_task

    made = summary["_made"]
    try:
        task = load_task(Path(summary["directory"]))
        source = (Path(summary["directory"]) / "kernel.py").read_text()
        operands = _kernel_operands(task, source)
    except Exception as exc:  # the check that follows says what is wrong with the task
        summary.setdefault("notes", []).append(f"the kernel's blocks could not be read: {exc}")
        return
    granules = {d: g for d, g in nt.block_granules(made["shapes"], operands).items()
                if d not in made["check"]}  # a size given with --check stays as given
    plan = made["plan"]
    if granules:
        plan = nt.plan_task(plan.name, made["shapes"], made["check"], plan.description,
                            plan.family, granules)
        if plan.configs() != made["plan"].configs():
            nt.write_task(Path(summary["directory"]), plan, *made["write"], force=True)
            summary["configs"] = [{"name": c, "sizes": sizes, **extra}
                                  for c, sizes, extra in plan.configs()]
    summary["shrunk"] = nt.check_notes(made["shapes"], plan.check, granules)


def _kernel_operands(task: Any, source: str) -> list[dict[str, Any]]:
    """The operands (array shape and block) of every ``pallas_call`` of ``source`` at the
    task's production shape: the static analysis, in a worker's candidate process."""
    from tilewright.kernels.judge.options import ProfileOptions
    from tilewright.kernels.pool import LocalExecutor

    async def go() -> dict[str, Any]:
        async with LocalExecutor(workers=1) as judge:
            return await judge.profile(task, source, None,
                                       ProfileOptions(static_only=True, timeout_s=300.0))

    found = asyncio.run(go())
    if found.get("status") != "ok":
        raise RuntimeError((found.get("error") or {}).get("message") or "no analysis")
    return [op for k in (found.get("analysis") or {}).get("kernels") or []
            for op in k.get("operands") or []]


def _usage(message: str, next_step: str = "", as_json: bool = False) -> int:
    if as_json:
        print(json.dumps({"error": message, "next": next_step or None}))
    else:
        print(f"tilewright new: {message}", file=sys.stderr)
        if next_step:
            print(f"  next: {next_step}", file=sys.stderr)
    return EXIT_USAGE


def _destination(args: argparse.Namespace, name: str) -> Path:
    return Path(args.out).expanduser() if args.out else Path.cwd() / name


# -- from a function -------------------------------------------------------------------------

def _from_function(args: argparse.Namespace, split: bool = False) -> dict[str, Any]:
    """``split``: every axis of an input gets a size name of its own
    (``shapes.parse_shapes``); ``summary["_split"]`` says whether that changed names."""
    from tilewright.kernels.tasks import new as nt
    from tilewright.kernels.tasks.shapes import shares_within_an_input

    path, fn_name = nt.parse_target(args.source)
    fn, tree, text = nt.read_function(path, fn_name)
    bound = nt.parse_args(args.arg)
    if args.shape and args.example:
        raise nt.NewTaskError("give --shape or --example, not both")
    if args.example:
        if getattr(args, "_example_signature", None) is None:  # run it in a worker once
            args._example_signature = _shapes_of_example(args.example, fn, bound)
        signature = args._example_signature
        specs = [f"{n}={d}[{','.join(str(x) for x in shape)}]" for n, shape, d in signature]
        shapes = nt.shapes_from_signature(signature, split)
    elif args.shape:
        specs = list(args.shape)
        shapes = nt.parse_shapes(args.shape, split)
    else:
        arrays = [p.name for p in fn.params if p.kind in ("positional", "keyword")
                  and not p.has_default and p.name not in bound]
        raise nt.NewTaskError(
            f"give the shapes {fn_name}() runs at: --shape for each array argument"
            + (f" ({', '.join(arrays)})" if arrays else "") + ", or --example",
            f"e.g. --shape {(arrays or ['x'])[0]}=f32[4096,1024]")
    order, bound = nt.call_plan(fn, [s.name for s in shapes.inputs], bound)
    check = _sizes(args.check, "--check")
    name = args.name or fn_name
    doc = nt.docstring_summary(tree, fn_name)
    inputs_text = ", ".join(
        f"{s.name} {nt.SHORT.get(s.dtype, s.dtype)}[{','.join(str(shapes.dims[d]) for d in s.dims)}]"
        for s in shapes.inputs)
    description = args.description or (
        f"{doc} (`{fn_name}` from {path.name}, inputs {inputs_text})" if doc else
        f"`{fn_name}` from {path.name} as a Pallas TPU kernel; inputs {inputs_text}")
    plan = nt.plan_task(name, shapes, check, description, args.family)
    kernel = None
    siblings: list[Path] = []
    if args.kernel:
        kernel, siblings = nt.starting_kernel(args.kernel)
    dest = _destination(args, name)
    written = nt.write_task(dest, plan, fn, tree, text, order, bound, kernel, args.force)
    made = {"plan": plan, "shapes": shapes, "check": check,
            "write": (fn, tree, text, order, bound, kernel)}
    for sibling in siblings:  # the starting kernel's own helpers
        target = dest / sibling.name
        if not target.exists():
            import shutil

            if sibling.is_dir():
                shutil.copytree(sibling, target,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copyfile(sibling, target)
            written.append(target)
    return {"name": name, "directory": str(dest.resolve()), "from": f"{path}:{fn_name}",
            "files": [p.name for p in written], "inputs": [s.describe() for s in
                                                           sorted(shapes.inputs, key=lambda
                                                                  s: order.index(s.name))],
            "bound": {k: repr(v) for k, v in bound.items()},
            "configs": [{"name": c, "sizes": sizes, **extra} for c, sizes, extra in
                        plan.configs()],
            "shrunk": nt.check_notes(shapes, plan.check),
            "_split": split and shares_within_an_input(specs),
            "tolerance": nt.tolerance_note(plan), "_made": made}


def _sizes(pairs: list[str], flag: str) -> dict[str, int]:
    from tilewright.kernels.tasks.new import NewTaskError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value.strip().isdigit() or int(value) <= 0:
            raise NewTaskError(f"{flag} {pair!r} is not SIZE=N", f"e.g. {flag} x_0=256")
        out[key.strip()] = int(value)
    return out


def _shapes_of_example(spec: str, fn: Any, bound: dict[str, Any]) -> list[Any]:
    """Run the example-inputs function in a worker (under ``jax.eval_shape``: nothing
    is allocated) and read back its arrays' (name, shape, dtype)."""
    from tilewright.kernels.tasks import new as nt
    from tilewright.kernels.tasks.loaders import load_task
    from tilewright.kernels.tasks.task import TaskError

    path, ex_name = nt.parse_target(spec, "--example")
    ex, tree, text = nt.read_function(path, ex_name)
    takes_key = any(p.kind == "positional" for p in ex.params)
    params = [p.name for p in fn.params if p.kind in ("positional", "keyword")
              and p.name not in bound]
    with tempfile.TemporaryDirectory(prefix="tilewright-new-") as tmp:
        root = Path(tmp)
        code, statements = nt.extract(tree, text, [ex_name])
        for sibling in nt.sibling_modules(statements, path.parent):
            import shutil

            if sibling.is_dir():
                shutil.copytree(sibling, root / sibling.name)
            else:
                shutil.copyfile(sibling, root / sibling.name)
        module = nt.module_name(path)
        (root / f"{module}.py").write_text(code)
        (root / "reference.py").write_text(
            f"from {module} import {ex_name} as _example\n\n"
            f"_PARAMS = {params!r}\n\n\n"
            "def make_inputs(key):\n"
            f"    out = _example({'key' if takes_key else ''})\n"
            "    if isinstance(out, dict):\n"
            "        names = [p for p in _PARAMS if p in out] + [k for k in out if k not in _PARAMS]\n"
            "        return tuple(out[k] for k in names)\n"
            "    return tuple(out) if isinstance(out, (tuple, list)) else (out,)\n\n\n"
            "def reference(*inputs):\n    return inputs[0]\n")
        (root / "task.toml").write_text('name = "example"\n')
        try:
            task = load_task(root)
        except TaskError as exc:
            raise nt.NewTaskError(f"--example {spec}: {exc}") from exc
        reply = _worker_request("inputs", {"task": task.to_spec()})
        if reply.get("error"):
            raise nt.NewTaskError(f"--example {spec}: {reply['error'].get('message')}",
                                  "the function must return arrays (a tuple, or a dict by "
                                  "parameter name) and import with only jax and numpy")
        inputs = reply["configs"][0]["inputs"]
        names_out = _example_names(reply, params, len(inputs))
    return [(n, shape, dtype) for n, (shape, dtype) in zip(names_out, inputs, strict=True)]


def _example_names(reply: dict[str, Any], params: list[str], count: int) -> list[str]:
    from tilewright.kernels.tasks.new import NewTaskError

    if count > len(params):
        raise NewTaskError(f"--example returned {count} arrays, but the function takes "
                           f"{len(params)} array argument(s) ({', '.join(params)})")
    return params[:count]


# -- from a benchmark task -----------------------------------------------------------------

def _from_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from tilewright.kernels.tasks import convert as convert_task
    from tilewright.kernels.tasks.new import NewTaskError

    if args.shape or args.example or args.arg:
        raise NewTaskError("--shape, --example and --arg are for a function; a benchmark "
                           "task brings its own inputs (use --set for its sizes)")
    source = Path(args.source).expanduser().resolve()
    name = args.name or source.name
    return convert_task.convert(source, _destination(args, name), name, args.overrides,
                                args.check, _worker_request, kernel=args.kernel,
                                family=args.family, description=args.description,
                                force=args.force)


# -- checking what was written -----------------------------------------------------------------

def _worker_request(op: str, payload: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    """Worker op ``op`` on a one-off local judge (``inputs``, ``task_check``)."""
    from tilewright.kernels.pool import LocalExecutor
    from tilewright.kernels.pool.workers import WorkerStartError

    async def go() -> dict[str, Any]:
        async with LocalExecutor(workers=1) as judge:
            return await judge.request(op, payload, timeout)

    try:
        return asyncio.run(go())
    except WorkerStartError as exc:
        from tilewright.kernels.tasks.new import NewTaskError

        raise NewTaskError(f"could not start a JAX worker: {exc}",
                           "run `tilewright eval --task softmax` to see why, or pass "
                           "--no-check") from exc


def _check(directory: Path) -> dict[str, Any]:
    """Load the task as any task is loaded, then build inputs and trace the reference
    at every shape in a worker."""
    from tilewright.kernels.pool.workers import WorkerFailure, WorkerOpError
    from tilewright.kernels.tasks.loaders import load_task
    from tilewright.kernels.tasks.task import TaskError

    try:
        task = load_task(directory)
    except TaskError as exc:
        return {"ok": False, "error": str(exc)}
    try:
        reply = _worker_request("task_check", {"task": task.to_spec()})
    except (WorkerFailure, WorkerOpError) as exc:
        return {"ok": False, "error": f"the worker failed: {exc}"}
    except Exception as exc:  # NewTaskError from a worker that does not start
        return {"ok": False, "error": str(exc)}
    if reply.get("error"):
        error = reply["error"]
        where = error.get("where") or (f"{error['file']}:{error['line']}"
                                       if error.get("line") else error.get("file"))
        return {"ok": False, "error": error.get("message"), "where": where,
                "config": error.get("config")}
    return {"ok": True, "configs": reply["configs"]}


def _report(summary: dict[str, Any], as_json: bool) -> int:
    check = summary.get("check")
    ok = check is None or check.get("ok")
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
        return EXIT_OK if ok else EXIT_FAILED
    directory = Path(summary["directory"])
    try:
        shown = directory.relative_to(Path.cwd())
    except ValueError:
        shown = directory
    print(f"wrote task {summary['name']} in {shown}/ from {summary['from']}")
    print(f"  files    {', '.join(summary['files'])}")
    if summary.get("inputs"):
        print(f"  inputs   {', '.join(summary['inputs'])}")
    if summary.get("bound"):
        print("  bound    " + ", ".join(f"{k}={v}" for k, v in summary["bound"].items()))
    checked = {c["name"]: c for c in (check or {}).get("configs") or []}
    for config in summary["configs"]:
        sizes = " ".join(f"{k}={v}" for k, v in (config.get("sizes") or {}).items())
        if "variant" in (config.get("sizes") or {}) and config["name"] in checked:
            sizes = "inputs " + ", ".join(f"{_dt(d)}[{','.join(map(str, s))}]" for s, d in
                                          checked[config["name"]]["inputs"])
        role = ("production (the size you run; TPU compile and estimates)"
                if config.get("production") else
                "held out (correctness only, never shown to the agent)"
                if config.get("held_out") else "check (correctness trials)")
        where = ", large: not run in interpret mode on a CPU" if config.get("size") == "large" \
            else ""
        print(f"  {config['name']:<12}{sizes}  {role}{where}")
        seen = checked.get(config["name"])
        if seen and seen.get("outputs") and not config.get("held_out"):
            outs = ", ".join(f"{_dt(d)}[{','.join(map(str, s))}]" for s, d in seen["outputs"])
            print(f"  {'':<12}reference -> {outs}")
    if summary.get("tolerance"):
        print(f"  tolerance {summary['tolerance']}")
    shrunk = summary.get("shrunk") or {}
    if shrunk:
        print("  shrunk   " + "; ".join(f"{d}: {why}" for d, why in shrunk.items()))
    for note in summary.get("notes") or []:
        print(f"  note: {note}")
    if check is None:
        print("  not checked in a worker (--no-check): `tilewright tasks "
              f"{shown}` checks it")
    elif ok:
        print("  checked: a worker built the inputs and traced the reference at every shape")
    else:
        print(f"  PROBLEM: {check.get('error')}", file=sys.stderr)
        if check.get("where"):
            print(f"  at {check['where']}", file=sys.stderr)
        if summary.get("removed"):
            print(f"  the task was not kept ({shown}/ removed): fix the function or the "
                  "shapes and run `tilewright new` again, or add --keep-broken to keep it "
                  "and edit its files", file=sys.stderr)
        else:
            print(f"  next: fix the shapes (tilewright new ... --force) or the copied files "
                  f"in {shown}/, then `tilewright tasks {shown}`", file=sys.stderr)
    if ok:
        print("next:")
        if "kernel.py" in summary["files"]:
            print(f"  tilewright eval --task {shown}")
        else:
            print(f"  tilewright eval --task {shown} --kernel YOUR_KERNEL.py")
        print(f"  tilewright --task {shown}          # the workbench (the offline agent "
              "writes a first kernel if there is none)")
    return EXIT_OK if ok else EXIT_FAILED


def _dt(dtype: str) -> str:
    from tilewright.kernels.tasks.new import SHORT

    return SHORT.get(dtype, dtype)
