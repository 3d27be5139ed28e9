"""Task loaders (native, JAXBench, MaxKernel), ``--set`` overrides, the worker-side
runtime adapter, and ``tilewright tasks``.

Good tasks are the fixtures in tests/fixtures/tasks/ and the bundled tasks; malformed
ones are written here next to the assertion about their error. Runtime checks use
real JAX on the CPU (they stand in for the worker process).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import environments
import pytest

from tilewright.kernels.tasks.loaders import (
    bundled_tasks,
    detect_layout,
    find_tasks,
    load_task,
    load_with_shared,
    parse_overrides,
)
from tilewright.kernels.tasks.task import Task, TaskError, UnknownOverride

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return root


NATIVE_REF = """
    import jax

    def make_inputs(key, rows=8, cols=128):
        return (jax.random.normal(key, (rows, cols)),)

    def reference(x):
        return x * 2
"""
NATIVE_TOML = """
    name = "double"
    [shapes.a]
    rows = 8
    cols = 128
    [shapes.b]
    rows = 16
    cols = 128
    held_out = true
"""


def native(tmp_path: Path, toml: str = NATIVE_TOML, ref: str = NATIVE_REF, **extra: str) -> Path:
    return write(tmp_path / "task", {"task.toml": toml, "reference.py": ref, **extra})


# -- native ---------------------------------------------------------------------------

def test_native_fixture_loads_with_shapes_tolerances_and_kernel() -> None:
    task = load_task(FIXTURES / "native_axpy")
    assert (task.name, task.layout, task.family, task.entry) == ("axpy", "native", "elementwise",
                                                                 "kernel")
    assert [s.name for s in task.shapes] == ["small", "other", "secret", "big"]
    assert [s.name for s in task.visible_shapes()] == ["small", "other", "big"]
    assert [s.name for s in task.shapes_for("cpu")] == ["small", "other", "secret"]
    assert task.shapes[3].size == "large" and task.shapes[3].rtol == 1e-5
    assert task.meta["tolerances"] == {"bfloat16": {"atol": 1e-2, "rtol": 1e-2}}
    assert task.kernel_path == FIXTURES / "native_axpy" / "kernel.py"
    assert Task.from_spec(json.loads(json.dumps(task.to_spec()))) == task


def test_bundled_task_by_name_or_file_path() -> None:
    names = [t.name for t in bundled_tasks()]
    assert names == sorted(names) and "softmax" in names
    by_name = load_task("softmax")
    assert by_name.layout == "native" and by_name.root.name == "softmax"
    assert load_task(by_name.root / "task.toml") == by_name


def test_without_shapes_a_native_task_has_one_small_default(tmp_path: Path) -> None:
    task = load_task(native(tmp_path, toml='name = "x"\n'))
    assert [(s.name, s.params, s.size) for s in task.shapes] == [("default", {}, "small")]


@pytest.mark.parametrize(("toml", "line", "words"), [
    ('name = "x"\n[shapes.a\nrows = 8\n', 2, "TOML syntax error"),
    ('name = "x"\nrequire_palas = true\n', 2, "unknown key 'require_palas'"),
    ('name = "x"\n[shapes.a]\nrows = 8\nsize = "huge"\n', 2, "size is 'huge'"),
    ('[shapes.a]\nrows = 8\nheld_out = true\n[shapes.b]\nrows = 8\nheld_out = true\n'
     '[shapes.c]\nrows = 8\n', 4, "2 shapes are held out"),
    ('[shapes.a]\nrows = 8\nwidth = 3\n', 1, "sets 'width', which make_inputs"),
    ('atol = "tight"\n', 1, "atol must be a non-negative number"),
])
def test_malformed_task_toml_names_file_line_and_expectation(tmp_path: Path, toml: str,
                                                             line: int, words: str) -> None:
    root = native(tmp_path, toml=toml)
    with pytest.raises(TaskError) as info:
        load_task(root)
    err = info.value
    assert err.path == str(root / "task.toml") and err.line == line
    assert words in str(err) and err.expected


def test_reference_without_required_function_or_with_a_syntax_error(tmp_path: Path) -> None:
    root = native(tmp_path, ref="import jax\n\ndef make_inputs(key):\n    return ()\n")
    with pytest.raises(TaskError, match=r"reference\.py: no top-level function `reference`"
                       r".*expected: def reference\(\*inputs\)"):
        load_task(root)
    (root / "reference.py").write_text("def make_inputs(key):\n    return (\n\ndef reference(x)\n")
    with pytest.raises(TaskError) as info:
        load_task(root)
    assert info.value.path.endswith("reference.py") and info.value.line == 2
    assert "syntax error" in str(info.value)
    (root / "reference.py").unlink()
    with pytest.raises(TaskError, match=r"reference\.py is missing"):
        load_task(root)


def test_a_broken_starting_kernel_is_a_warning_not_a_task_error(tmp_path: Path) -> None:
    root = native(tmp_path, **{"kernel.py": "def kernal(x):\n    return x\n"})
    task = load_task(root)
    assert task.kernel_path == root / "kernel.py"
    assert "defines no `kernel`" in task.meta["warnings"][0]
    (root / "kernel.py").write_text("def kernel(x):\n    return x +\n")
    assert "kernel.py:2: Python syntax error" in load_task(root).meta["warnings"][0]


def test_unknown_layout_and_missing_directory_are_clear(tmp_path: Path) -> None:
    write(tmp_path / "notes", {"README.md": "just notes\n"})
    assert detect_layout(tmp_path / "notes") is None
    with pytest.raises(TaskError, match=r"not a task directory.*task\.toml \(native\), "
                       r"kernel_task\.yaml \(MaxKernel\) or baseline\.py \(JAXBench\)"):
        load_task(tmp_path / "notes")
    with pytest.raises(TaskError, match=r"no such task directory.*bundled task name.*softmax"):
        load_task("no_such_task_anywhere")


# -- --set overrides ------------------------------------------------------------------

def test_parse_overrides() -> None:
    assert parse_overrides(["rows=128", "dtype = bfloat16", "name.k=1"]) == {
        "rows": "128", "dtype": "bfloat16", "name.k": "1"}
    for bad in ("rows", "=3", "rows="):
        with pytest.raises(ValueError, match="expected KEY=VALUE"):
            parse_overrides([bad])


def test_native_overrides_apply_everywhere_or_to_one_shape(tmp_path: Path) -> None:
    root = native(tmp_path)
    task = load_task(root, {"cols": "256"})
    assert [s.params for s in task.shapes] == [{"rows": 8, "cols": 256}, {"rows": 16, "cols": 256}]
    assert task.meta["overrides"] == {"cols": "256"}
    task = load_task(root, {"a.rows": "32"})
    assert [s.params["rows"] for s in task.shapes] == [32, 16]
    assert [s.name for s in task.visible_shapes()] == ["a"]  # still never the held-out one
    with pytest.raises(TaskError, match=r"--set depth=2: no shape parameter 'depth'.*cols, rows"):
        load_task(root, {"depth": "2"})
    with pytest.raises(TaskError, match=r"no shape named 'c'"):
        load_task(root, {"c.rows": "2"})


def test_jaxbench_overrides_config_keys_constants_and_dtype() -> None:
    task = load_task(FIXTURES / "jaxbench_scaled_tanh", {"rows": "16", "cols": "256",
                                                         "dtype": "bfloat16"})
    assert task.shapes[0].params == {"rows": 16, "cols": 256, "dtype": "bfloat16"}
    assert task.meta["config"]["rows"] == 16 and task.meta["dtype"] == "bfloat16"
    with pytest.raises(TaskError, match=r"--set depth=2: not a CONFIG key.*cols.*rows"):
        load_task(FIXTURES / "jaxbench_scaled_tanh", {"depth": "2"})
    with pytest.raises(TaskError, match=r"dtype=int4: unsupported dtype"):
        load_task(FIXTURES / "jaxbench_scaled_tanh", {"dtype": "int4"})
    task = load_task(FIXTURES / "jaxbench_kernelbench_style", {"batch_size": "8", "dim": "128"})
    assert task.shapes[0].params == {"batch_size": 8, "dim": 128}


def test_a_jaxbench_task_loads_in_its_published_dtype(tmp_path: Path) -> None:
    """JAXBench's harness calls create_inputs(dtype=jnp.bfloat16) whenever it takes a
    dtype, whatever its default: that is the dtype the task runs in, at the check shapes
    and at production; --set dtype= changes it."""
    bf16 = load_task(FIXTURES / "jaxbench_scaled_tanh", {"rows": "16", "cols": "256"})
    assert bf16.meta["dtype"] == "bfloat16"
    assert bf16.production_task().meta["dtype"] == "bfloat16"
    assert load_task(FIXTURES / "jaxbench_scaled_tanh",
                     {"dtype": "float32"}).meta["dtype"] == "float32"
    text = (FIXTURES / "jaxbench_scaled_tanh" / "baseline.py").read_text()
    for written, expected in (("dtype=jnp.float32", "bfloat16"), ("dtype=None", "bfloat16"),
                              ("*, dtype=jnp.float16", "bfloat16"), ("", "float32")):
        root = tmp_path / (written.replace("*", "").replace(",", "").replace("=", "_")
                           .replace(".", "_").strip() or "no_dtype")
        root.mkdir(parents=True)
        (root / "baseline.py").write_text(text.replace("dtype=jnp.bfloat16", written)
                                          .replace("dtype=dtype", ""))
        assert load_task(root).meta["dtype"] == expected, written


def test_maxkernel_overrides_input_gen_constants() -> None:
    task = load_task(FIXTURES / "maxkernel_row_scale", {"ROWS": "16"})
    assert [s.params for s in task.shapes] == [{"index": 0, "ROWS": 16}, {"index": 1, "ROWS": 16}]
    with pytest.raises(TaskError, match=r"--set COLS=16: input_gen_code sets no literal "
                       r"named 'COLS'.*ROWS"):
        load_task(FIXTURES / "maxkernel_row_scale", {"COLS": "16"})


# -- JAXBench -------------------------------------------------------------------------

def test_jaxbench_fixture_loads() -> None:
    task = load_task(FIXTURES / "jaxbench_scaled_tanh")
    assert (task.layout, task.entry, task.atol, task.rtol) == ("jaxbench", "workload", 1e-5, 1e-5)
    assert [(s.name, s.size) for s in task.shapes] == [("default", "small")]
    assert task.description.startswith("Scaled tanh")
    assert task.kernel_path.name == "optimized.py" and task.meta["has_flops"]
    assert task.meta["config"]["dtype_name"] == "jnp.bfloat16"  # non-literal kept as text
    plain = load_task(FIXTURES / "jaxbench_kernelbench_style")
    assert (plain.atol, plain.rtol) == (1e-2, 1e-2)  # JAXBench's own default


@pytest.mark.parametrize(("source", "line", "words"), [
    ("CONFIG = [1, 2]\ndef create_inputs(dtype=None):\n    return ()\ndef workload(x):\n"
     "    return x\n", 1, "CONFIG is not a dict literal"),
    ("CONFIG = {'m': 1}\ndef create_inputs(dtype=None):\n    return ()\n", None,
     "no top-level function `workload`"),
    ("def workload(x):\n    return x\n", None, "no top-level function `create_inputs`"),
    ("CONFIG = {'m': 1\ndef workload(x):\n", 1, "syntax error"),
])
def test_malformed_jaxbench_baseline(tmp_path: Path, source: str, line: int | None,
                                     words: str) -> None:
    root = write(tmp_path / "wl", {"baseline.py": source})
    with pytest.raises(TaskError) as info:
        load_task(root)
    assert info.value.path == str(root / "baseline.py") and info.value.line == line
    assert words in str(info.value) and info.value.expected


KERNELBENCH_STYLE = """
    import jax
    CONFIG = {'batch_size': 4096, 'in_features': 8192, 'out_features': 8192, 'scale': 2.0}
    def create_inputs(dtype=None):
        key = jax.random.key(0)
        k1, k2 = jax.random.split(key, 2)
        x = jax.random.uniform(k1, (4096, 8192))
        w = jax.random.normal(k2, (8192, 8192)) * 0.02
        return x, w
    def workload(x, w):
        return (x @ w) * 2.0
"""


def test_jaxbench_set_rewrites_hard_coded_sizes(tmp_path: Path) -> None:
    root = write(tmp_path / "kb", {"baseline.py": KERNELBENCH_STYLE})
    task = load_task(root, {"batch_size": "8", "in_features": "128", "out_features": "128"})
    assert sorted(task.meta["literal_rewrites"]) == [[4096, 8], [8192, 128]]
    source = task.reference_source()
    # same lines, sizes replaced; the split count (2) and the scale literal untouched
    assert len(source.splitlines()) == len((root / "baseline.py").read_text().splitlines())
    assert "(8, 128)" in source and "(128, 128)" in source
    assert "split(key, 2)" in source and "* 2.0" in source
    assert task.meta["config"]["in_features"] == 128


def test_jaxbench_set_refuses_a_size_two_keys_share(tmp_path: Path) -> None:
    root = write(tmp_path / "kb", {"baseline.py": KERNELBENCH_STYLE})
    with pytest.raises(TaskError) as info:
        load_task(root, {"in_features": "128"})
    message = str(info.value)
    assert "8192" in message and "out_features" in message and info.value.line == 6
    with pytest.raises(TaskError):  # both set, to different values: still ambiguous
        load_task(root, {"in_features": "128", "out_features": "256"})


def test_jaxbench_set_refuses_a_key_that_reaches_nothing(tmp_path: Path) -> None:
    root = write(tmp_path / "kb", {"baseline.py": KERNELBENCH_STYLE.replace(
        "'scale': 2.0", "'heads': 16")})
    with pytest.raises(UnknownOverride) as info:
        load_task(root, {"heads": "4"})
    assert "cannot reach the inputs" in str(info.value)


def test_shared_overrides_apply_together_and_skip_unknown_keys(tmp_path: Path) -> None:
    root = write(tmp_path / "kb", {"baseline.py": KERNELBENCH_STYLE})
    task, skipped = load_with_shared(root, {"in_features": "64", "out_features": "64",
                                            "seq_len": "32"})
    assert skipped == ["seq_len"]
    assert task.meta["literal_rewrites"] == [[8192, 64]]


# -- MaxKernel ------------------------------------------------------------------------

def test_maxkernel_fixture_loads_per_configuration_tolerances() -> None:
    task = load_task(FIXTURES / "maxkernel_row_scale")
    assert (task.name, task.layout, task.entry) == ("row_scale", "maxkernel", "computation")
    assert [(s.name, s.params, s.atol) for s in task.shapes] == [
        ("config_0", {"index": 0}, 1e-6), ("config_1", {"index": 1}, 1e-5)]
    assert task.rtol == 1e-6 and task.input_gen_path.name == "kernel_task.yaml"
    assert task.meta["input_gen_line_offset"] == 7


REF_COMPUTATION = "def computation(x, scale):\n    return x * scale\n"


@pytest.mark.parametrize(("yaml_text", "line", "words"), [
    ("task_id: t\ndescription: [unclosed\ninput_gen_code: x\n", 3, "YAML syntax error"),
    ("task_id: t\n  bad: indent\n", 2, "YAML syntax error"),
    ("- just\n- a list\n", None, "not a mapping"),
    ("task_id: t\n", None, "input_gen_code is missing"),
    ("task_id: t\ninput_gen_code: |\n  def make():\n      return 1\n", None,
     "no top-level function `get_inputs`"),
    ("task_id: t\ninput_gen_code: |\n  def get_inputs():\n      return (\n", 4, "syntax error"),
    ("task_id: t\natol: fine\ninput_gen_code: |\n  def get_inputs():\n      return [], []\n",
     2, "atol has 'fine'"),
])
def test_malformed_maxkernel_yaml(tmp_path: Path, yaml_text: str, line: int | None,
                                  words: str) -> None:
    root = write(tmp_path / "mk", {"kernel_task.yaml": yaml_text,
                                   "reference.py": REF_COMPUTATION})
    with pytest.raises(TaskError) as info:
        load_task(root)
    assert info.value.path == str(root / "kernel_task.yaml")
    assert info.value.line == line and words in str(info.value)


def test_maxkernel_short_tolerance_lists_reuse_their_last_entry(tmp_path: Path) -> None:
    """As MaxKernel's evaluator does: a list shorter than the configurations reuses its
    last entry (with a warning), for counted and for worker-counted configurations."""
    root = write(tmp_path / "mk", {
        "kernel_task.yaml": "task_id: t\natol: [0.1, 0.2]\ninput_gen_code: |\n"
                            "  def get_inputs():\n"
                            "      return [((1,), ()), ((2,), ()), ((3,), ())]\n",
        "reference.py": REF_COMPUTATION})
    task = load_task(root)
    assert [s.atol for s in task.shapes] == [0.1, 0.2, 0.2]
    assert "reused" in task.meta["warnings"][0]


def test_maxkernel_reference_needs_computation(tmp_path: Path) -> None:
    root = write(tmp_path / "mk", {
        "kernel_task.yaml": "task_id: t\ninput_gen_code: |\n  def get_inputs():\n"
                            "      return [], []\n",
        "reference.py": "def compute(x):\n    return x\n"})
    with pytest.raises(TaskError, match=r"reference\.py: no top-level function `computation`"):
        load_task(root)


# -- finding tasks --------------------------------------------------------------------

def mixed_dir(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    shutil.copytree(FIXTURES, root)
    write(root / "nested" / "deeper" / "broken_toml", {"task.toml": "[shapes.a\n",
                                                       "reference.py": NATIVE_REF})
    write(root / "broken_yaml", {"kernel_task.yaml": "task_id: [\n", "reference.py": ""})
    write(root / "not_a_task", {"notes.txt": "hello\n"})
    return root


def test_find_tasks_lists_all_layouts_and_broken_ones(tmp_path: Path) -> None:
    found = find_tasks(mixed_dir(tmp_path))
    tasks = [f for f in found if isinstance(f, Task)]
    errors = [f for f in found if isinstance(f, TaskError)]
    assert sorted((t.name, t.layout) for t in tasks) == [
        ("axpy", "native"), ("gemm_relu", "maxkernel"), ("jaxbench_kernelbench_style", "jaxbench"),
        ("jaxbench_scaled_tanh", "jaxbench"), ("row_scale", "maxkernel")]
    assert sorted(Path(e.path).parent.name for e in errors) == ["broken_toml", "broken_yaml"]
    with pytest.raises(TaskError, match="no such directory"):
        find_tasks(tmp_path / "missing")


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys, json\nfrom tilewright.tui.cli import main\nrc = main(sys.argv[1:])\n"
            "sys.stdout.flush()\n"
            "print('JAX-LOADED' if any(m == 'jax' for m in sys.modules) else 'NO-JAX', "
            "file=sys.stderr)\nsys.exit(rc)\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, env=environments.bare(COLUMNS="200"), timeout=60)


def test_tilewright_tasks_json_on_a_mixed_directory(tmp_path: Path) -> None:
    proc = _cli("tasks", str(mixed_dir(tmp_path)), "--json")
    assert proc.returncode == 1, proc.stderr  # some tasks are broken
    assert "NO-JAX" in proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == "tilewright.tasks/1"
    rows = {(r["origin"], r["name"]): r for r in data["tasks"] if not r["error"]}
    assert {n for o, n in rows if o == "bundled"} == {
        "gelu", "softmax", "rmsnorm", "matmul_bias_gelu", "causal_attention"}
    assert {(n, rows["found", n]["layout"]) for o, n in rows if o == "found"} == {
        ("axpy", "native"), ("jaxbench_kernelbench_style", "jaxbench"),
        ("jaxbench_scaled_tanh", "jaxbench"), ("row_scale", "maxkernel"),
        ("gemm_relu", "maxkernel")}
    axpy = rows["found", "axpy"]
    assert {k: axpy["shapes"][k] for k in ("small", "large", "held_out")} == {
        "small": 2, "large": 1, "held_out": 1}
    assert "secret" not in json.dumps(axpy)  # held-out shapes are counted, never shown
    broken = [r for r in data["tasks"] if r["error"]]
    assert len(broken) == 2 and any("TOML syntax error" in r["error"] for r in broken)


def test_tilewright_tasks_table(tmp_path: Path) -> None:
    proc = _cli("tasks", str(mixed_dir(tmp_path)))
    assert proc.returncode == 1
    for text in ("causal_attention", "row_scale", "maxkernel", "jaxbench", "1 held-out",
                 "YAML syntax error", "broken_toml"):
        assert text in proc.stdout, text
    proc = _cli("tasks")
    assert proc.returncode == 0 and "matmul_bias_gelu" in proc.stdout
    proc = _cli("tasks", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such directory" in proc.stderr


# -- worker-side runtime (real JAX on the CPU, as inside a worker) ---------------------

def _runtime(task: Task):
    pytest.importorskip("jax")
    from tilewright.kernels.worker.runtime import load_runtime

    return load_runtime(json.loads(json.dumps(task.to_spec())))


def _key(seed: int):
    import jax

    return jax.random.PRNGKey(seed)


def test_native_runtime_inputs_reference_flops_and_tolerances() -> None:
    import jax
    import numpy as np

    rt = _runtime(load_task(FIXTURES / "native_axpy"))
    assert [c.name for c in rt.configs_for("cpu")] == ["small", "other", "secret"]
    small = rt.configs()[0]
    (x, y), static = rt.make_inputs(small, _key(1))
    assert static == () and x.shape == (16, 128) and x.dtype == np.float32
    again, _ = rt.make_inputs(small, _key(1))
    other, _ = rt.make_inputs(small, _key(2))
    assert np.array_equal(again[0], x) and not np.array_equal(other[0], x)
    assert np.allclose(rt.reference(x, y), 2 * x + y)
    assert rt.flops(small, (x, y)) == 2 * x.size == rt.flops(small, ((x, y), ()))
    assert rt.tolerance(small, np.float32) == (1e-6, 1e-6)
    assert rt.tolerance(small, jax.numpy.bfloat16) == (1e-2, 1e-2)
    assert rt.tolerance(rt.configs()[3], np.float32) == (1e-6, 1e-5)


def test_native_make_inputs_returning_a_bare_array_is_a_task_error(tmp_path: Path) -> None:
    ref = NATIVE_REF.replace("return (jax.random.normal(key, (rows, cols)),)",
                             "return jax.random.normal(key, (rows, cols))")
    rt = _runtime(load_task(native(tmp_path, ref=ref)))
    with pytest.raises(TaskError) as info:
        rt.make_inputs(rt.configs()[0], _key(0))
    err = info.value
    assert err.path.endswith("reference.py") and err.line == 3
    assert "make_inputs returned an array of shape (8, 128) (return (x,) for a single input)" in str(err)
    assert err.expected == "a tuple of arrays"


def test_reference_that_fails_to_import_names_its_line(tmp_path: Path) -> None:
    ref = NATIVE_REF + "\n    BROKEN = 1 / 0\n"
    with pytest.raises(TaskError) as info:
        _runtime(load_task(native(tmp_path, ref=ref)))
    assert info.value.line == 9 and "ZeroDivisionError" in str(info.value)


def test_candidates_keep_their_filename_and_line_numbers(tmp_path: Path) -> None:
    import traceback

    from tilewright.kernels.worker.runtime import MissingEntryPoint

    rt = _runtime(load_task(native(tmp_path)))
    with pytest.raises(SyntaxError) as info:
        rt.load_candidate("import jax\n\ndef kernel(x):\n    return x +\n", "cand_v3.py")
    assert (info.value.filename, info.value.lineno) == ("cand_v3.py", 4)
    fn = rt.load_candidate("STATE = []\n\ndef kernel(x):\n    STATE.append(1)\n"
                           "    raise ValueError(len(STATE))\n", "cand_v4.py")
    with pytest.raises(ValueError) as err:
        fn(1)
    frame = traceback.extract_tb(err.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno, frame.line) == ("cand_v4.py", 5,
                                                          "raise ValueError(len(STATE))")
    fresh = rt.load_candidate("STATE = []\n\ndef kernel(x):\n    STATE.append(1)\n"
                              "    raise ValueError(len(STATE))\n", "cand_v4.py")
    with pytest.raises(ValueError, match=r"^1$"):  # a fresh module: no state carried over
        fresh(1)
    with pytest.raises(MissingEntryPoint, match=r"cand_v5\.py defines no function `kernel` "
                       r"\(it defines: helper\)"):
        rt.load_candidate("def helper(x):\n    return x\n", "cand_v5.py")


def test_jaxbench_runtime_overrides_reach_baseline_and_candidate() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu

    task = load_task(FIXTURES / "jaxbench_scaled_tanh", {"rows": "16", "cols": "256"})
    rt = _runtime(task)
    original_key, original_prng_key = jax.random.key, jax.random.PRNGKey
    config = rt.configs()[0]
    (x, w), static = rt.make_inputs(config, _key(1))
    # the dtype JAXBench benchmarks it in: create_inputs(dtype=jnp.bfloat16)'s default
    assert (x.shape, w.shape, x.dtype, static) == ((16, 256), (1, 256), jnp.bfloat16, ())
    # create_inputs seeds itself with key(42): the trial key still yields fresh inputs.
    x2, _ = rt.make_inputs(config, _key(2))[0]
    x1, _ = rt.make_inputs(config, _key(1))[0]
    assert np.array_equal(x1, x) and not np.array_equal(x2, x)
    assert (jax.random.key, jax.random.PRNGKey) == (original_key, original_prng_key)  # restored
    assert rt.flops(config, (x, w)) == 2 * 16 * 256
    candidate = rt.load_candidate(task.starting_source(), str(task.kernel_path))
    with pltpu.force_tpu_interpret_mode():
        out = candidate(x, w)  # asserts inside that CONFIG was overridden for it too
    assert np.allclose(out, rt.reference(x, w), atol=1e-5)
    bf16 = _runtime(load_task(FIXTURES / "jaxbench_scaled_tanh",
                              {"rows": "8", "cols": "128", "dtype": "bfloat16"}))
    assert bf16.make_inputs(bf16.configs()[0], _key(0))[0][0].dtype == jax.numpy.bfloat16


def test_jaxbench_module_constants_and_wrong_return_type(tmp_path: Path) -> None:
    rt = _runtime(load_task(FIXTURES / "jaxbench_kernelbench_style",
                            {"batch_size": "8", "dim": "128"}))
    (x,), _ = rt.make_inputs(rt.configs()[0], _key(0))
    assert x.shape == (8, 128) and rt.flops(rt.configs()[0], (x,)) is None
    root = write(tmp_path / "wl", {"baseline.py": """
        import jax.numpy as jnp
        CONFIG = {'n': 8}
        def create_inputs(dtype=jnp.float32):
            return {'x': jnp.ones((CONFIG['n'],), dtype)}
        def workload(x):
            return x
    """})
    rt = _runtime(load_task(root))
    with pytest.raises(TaskError) as info:
        rt.make_inputs(rt.configs()[0], _key(0))
    assert info.value.path.endswith("baseline.py") and info.value.line == 3
    assert "create_inputs returned a dict" in str(info.value)


def test_maxkernel_runtime_pairs_static_args_and_fresh_inputs() -> None:
    import numpy as np

    rt = _runtime(load_task(FIXTURES / "maxkernel_row_scale", {"ROWS": "8"}))
    c0, c1 = rt.configs()
    (x, s), static = rt.make_inputs(c0, _key(1))
    assert (x.shape, s.shape, static) == ((8, 128), (8, 1), (1.0,))
    (x1, _), static1 = rt.make_inputs(c1, _key(1))
    assert x1.shape == (8, 256) and static1 == (-0.5,)
    assert not np.array_equal(rt.make_inputs(c0, _key(2))[0][0], x)
    assert np.allclose(rt.reference(x, s, *static), x * s + 1.0)
    assert rt.tolerance(c0) == (1e-6, 1e-6) and rt.tolerance(c1) == (1e-5, 1e-6)


def test_maxkernel_runtime_counts_configs_and_reports_bad_get_inputs(tmp_path: Path) -> None:
    root = write(tmp_path / "mk", {
        "kernel_task.yaml": """
            task_id: counted_at_runtime
            input_gen_code: |
              import jax.numpy as jnp
              SIZES = (8, 16, 32)

              def get_inputs():
                  out = [((jnp.ones((n, 128)),), (2.0,)) for n in SIZES]
                  return out
            """,
        "reference.py": REF_COMPUTATION})
    task = load_task(root)
    assert len(task.shapes) == 1 and not task.meta["configs_counted"]
    rt = _runtime(task)
    assert [c.name for c in rt.configs()] == ["config_0", "config_1", "config_2"]
    assert rt.make_inputs(rt.configs()[2], _key(0))[0][0].shape == (32, 128)

    for body, words in [("return {'x': 1}", "get_inputs() returned a dict"),
                        ("return [((1.0,), ())]", "element 0 is float, not an array")]:
        (root / "kernel_task.yaml").write_text(
            f"task_id: bad\ninput_gen_code: |\n  def get_inputs():\n      {body}\n")
        rt = _runtime(load_task(root))
        with pytest.raises(TaskError) as info:
            rt.make_inputs(rt.configs()[0], _key(0))
        assert info.value.path.endswith("kernel_task.yaml") and info.value.line == 3
        assert words in str(info.value)


def test_maxkernel_set_reaches_sizes_inside_get_inputs() -> None:
    import traceback

    import numpy as np

    task = load_task(FIXTURES / "maxkernel_gemm_relu",
                     {"batch_size": "16", "in_features": "128", "out_features": "256"})
    assert len(task.shapes) == 1 and task.meta["configs_counted"]  # `return d, s`: one pair
    rt = _runtime(task)
    (x, w, b), static = rt.make_inputs(rt.configs()[0], _key(0))
    assert (x.shape, w.shape, b.shape, static) == ((16, 128), (128, 256), (256,), ())
    assert np.all(rt.reference(x, w, b) >= 0)
    # The rewritten code keeps the YAML's line numbers.
    rt = _runtime(load_task(FIXTURES / "maxkernel_gemm_relu", {"in_features": "'wide'"}))
    with pytest.raises(TaskError) as info:
        rt.make_inputs(rt.configs()[0], _key(1))
    assert info.value.line == 15 and "TypeError" in str(info.value)
    frames = [f for f in traceback.extract_tb(info.value.__cause__.__traceback__)
              if f.filename.endswith("kernel_task.yaml")]
    assert frames[-1].lineno == 15 and "config['in_features']" in frames[-1].line


def test_maxkernel_errors_inside_get_inputs_point_at_the_yaml_line(tmp_path: Path) -> None:
    import traceback

    root = write(tmp_path / "mk", {
        "kernel_task.yaml": "task_id: t\nrtol: 0.1\ninput_gen_code: |\n  def get_inputs():\n"
                            "      return undefined_name\n",
        "reference.py": REF_COMPUTATION})
    rt = _runtime(load_task(root))
    with pytest.raises(TaskError) as info:
        rt.make_inputs(rt.configs()[0], _key(0))
    assert info.value.path.endswith("kernel_task.yaml") and info.value.line == 5
    assert "NameError" in str(info.value)
    frame = traceback.extract_tb(info.value.__cause__.__traceback__)[-1]
    assert frame.filename.endswith("kernel_task.yaml") and frame.lineno == 5


def test_maxkernel_input_code_sees_jax_and_jnp_like_maxkernels_harness(tmp_path: Path) -> None:
    """33 of MaxKernel's public tasks write `def get_inputs(dtype=jnp.bfloat16):` without
    importing jnp: MaxKernel's harness execs the code where jax and jnp are imported."""
    root = write(tmp_path / "mk", {
        "kernel_task.yaml": "task_id: t\nrtol: 0.1\ninput_gen_code: |\n"
                            "  def get_inputs(dtype=jnp.bfloat16):\n"
                            "      x = jax.random.normal(jax.random.key(0), (8, 128), dtype)\n"
                            "      return [x, x], []\n",
        "reference.py": REF_COMPUTATION})
    rt = _runtime(load_task(root))
    (x, _), static = rt.make_inputs(rt.configs()[0], _key(0))
    assert x.shape == (8, 128) and str(x.dtype) == "bfloat16" and static == ()
    dyn, static, how = rt.input_signature(rt.configs()[0])
    assert how == "abstract" and [tuple(a.shape) for a in dyn] == [(8, 128), (8, 128)]


def test_a_task_without_a_production_shape_runs_at_its_largest_visible_one() -> None:
    """The one rule (docs/EVALUATION.md): the production configuration, else the largest
    visible check configuration; a held-out one is never chosen."""
    from dataclasses import replace

    task = load_task(FIXTURES / "jaxbench_scaled_tanh", {"rows": "16", "cols": "256"})
    small = task.shapes[0]
    big = replace(small, name="big", params={**small.params, "rows": 64})
    hidden = replace(small, name="hidden", params={**small.params, "rows": 4096},
                     held_out=True)
    by_hand = replace(task, shapes=(small, big, hidden), production=None)
    found = by_hand.production_task()
    assert found is not None and [s.name for s in found.shapes] == ["big"]
    assert replace(task, shapes=(), production=None).production_task() is None
