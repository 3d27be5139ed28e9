"""The TUNABLES convention: reading, rewriting byte for byte, and TPU legality."""

from __future__ import annotations

import textwrap

import pytest

from tilewright.kernels.source import inferred, tunables
from tilewright.kernels.tasks.loaders import load_task

SOURCE = '''"""A kernel."""
import jax

BLOCK_ROWS = 64  # rows per step — tuned
BLOCK_COLS = (
    256
)
MODE: str = "fast"
TUNABLES = {"BLOCK_ROWS": [8, 12, 16, 64, 256], "BLOCK_COLS": [100, 128, 256, 512],
            "MODE": ["fast", "safe"]}


def kernel(x):
    return x * BLOCK_ROWS  # BLOCK_ROWS = 64 in a comment stays
'''


def test_read_returns_current_values_and_choices() -> None:
    declared = tunables.read(SOURCE)
    assert declared == {"BLOCK_ROWS": (64, [8, 12, 16, 64, 256]),
                        "BLOCK_COLS": (256, [100, 128, 256, 512]),
                        "MODE": ("fast", ["fast", "safe"])}
    assert tunables.config_of(SOURCE) == {"BLOCK_ROWS": 64, "BLOCK_COLS": 256, "MODE": "fast"}


def test_apply_rewrites_only_the_assignments() -> None:
    new = tunables.apply(SOURCE, {"BLOCK_ROWS": 256, "BLOCK_COLS": 512, "MODE": "safe"})
    assert "BLOCK_ROWS = 256  # rows per step — tuned\n" in new
    # only the value node changes: the parentheses around it are kept
    assert "BLOCK_COLS = (\n    512\n)\n" in new and "MODE: str = 'safe'\n" in new
    assert "# BLOCK_ROWS = 64 in a comment stays" in new
    assert tunables.config_of(new) == {"BLOCK_ROWS": 256, "BLOCK_COLS": 512, "MODE": "safe"}
    # every line that does not assign a tunable is untouched
    untouched = [line for line in SOURCE.splitlines() if not line.startswith(("BLOCK_", "MODE",
                                                                               "    256", ")"))]
    assert all(line in new.splitlines() for line in untouched)
    assert tunables.apply(new, {"BLOCK_ROWS": 64, "BLOCK_COLS": 256, "MODE": "fast"}).count("\n") \
        == new.count("\n")


def test_apply_refuses_undeclared_names_and_says_what_is_declared() -> None:
    with pytest.raises(tunables.TunablesError, match=r"BLOCK_R.*declared: BLOCK_ROWS"):
        tunables.apply(SOURCE, {"BLOCK_R": 8})


def test_broken_declarations_are_clear_errors() -> None:
    with pytest.raises(tunables.TunablesError, match="never assigns"):
        tunables.read('TUNABLES = {"B": [1, 2]}\n')
    with pytest.raises(tunables.TunablesError, match="assigned 2 times") as info:
        tunables.read('B = 1\nB = 2\nTUNABLES = {"B": [1, 2]}\n')
    assert info.value.line == 2
    with pytest.raises(tunables.TunablesError, match="literal"):
        tunables.read('B = 1\nTUNABLES = {"B": list(range(3))}\n')
    with pytest.raises(tunables.TunablesError, match="line 1: syntax"):
        tunables.read("B = = 1\n")
    assert tunables.read("x = 1\n") == {}


def test_legal_choices_follow_tpu_alignment() -> None:
    legal = tunables.legal_choices(SOURCE)
    assert legal["BLOCK_ROWS"] == [8, 16, 64, 256]  # 12 is not a multiple of 8
    assert legal["BLOCK_COLS"] == [128, 256, 512]  # 100 is not a multiple of 128
    assert legal["MODE"] == ["fast", "safe"]
    explicit = SOURCE.replace("TUNABLES =", 'TUNABLE_ALIGN = {"BLOCK_ROWS": 16}\nTUNABLES =')
    assert tunables.legal_choices(explicit)["BLOCK_ROWS"] == [16, 64, 256]


def test_legality_against_array_dims() -> None:
    assert tunables.is_legal("BLOCK_ROWS", 512, 8, (256,))  # clamps to the whole dim
    assert tunables.is_legal("BLOCK_ROWS", 12, 8, (12,))  # equals the whole dim
    assert not tunables.is_legal("BLOCK_COLS", 384, 128, (512,))  # does not tile 512
    assert not tunables.is_legal("BLOCK_ROWS", 0, 8)
    assert tunables.nearest_legal("BLOCK_ROWS", 12, [8, 12, 16, 32], 8) == 8
    assert tunables.nearest_legal("BLOCK_COLS", 200, [128, 200, 256], 128) == 256
    assert tunables.infer_alignment("BLOCK_K") == 128
    assert tunables.infer_alignment("BLOCK_KV") == 8
    assert tunables.infer_alignment("BLOCK_Q") == 8
    assert tunables.infer_alignment("NUM_STAGES") == 1


@pytest.mark.parametrize("name", ["gelu", "softmax", "rmsnorm", "matmul_bias_gelu",
                                  "causal_attention"])
def test_bundled_kernels_declare_legal_tunables(name: str) -> None:
    source = load_task(name).starting_source()
    declared = tunables.read(source)
    assert declared, f"{name}/kernel.py declares no TUNABLES"
    legal = tunables.legal_choices(source)
    for key, (current, choices) in declared.items():
        assert current in choices and legal[key] == choices, key


def test_an_unhashable_key_is_a_tunables_error_not_a_crash() -> None:
    # ast.literal_eval raises TypeError here, not ValueError.
    with pytest.raises(tunables.TunablesError, match="literal dict"):
        tunables.read("A = 1\nTUNABLES = {[1]: [1, 2]}\n")


def test_a_kernel_without_tunables_gets_them_from_its_blockspecs() -> None:
    """A user's own kernel: constants and literals in BlockSpec shapes become tunables,
    the grid's matching literal follows, and the offline agent proposes that first."""
    from tilewright import agents
    from tilewright.agents.base import AgentRequest, Proposal
    from tilewright.agents.offline import decide

    source = textwrap.dedent('''
        import jax
        from jax.experimental import pallas as pl

        BM = 64

        def _copy(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        def kernel(x):
            spec = pl.BlockSpec((BM, 512), lambda i, j: (i, j))
            return pl.pallas_call(_copy, grid=(x.shape[0] // BM, x.shape[1] // 512),
                                  in_specs=[spec], out_specs=spec,
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    ''')
    new_source, choices = inferred.infer(source)
    assert set(choices) == {"BM", "BLOCK_COLS"} and 512 in choices["BLOCK_COLS"]
    assert "x.shape[1] // BLOCK_COLS" in new_source and "(BM, BLOCK_COLS)" in new_source
    assert tunables.alignment(new_source) == {"BM": 8, "BLOCK_COLS": 128}
    changed = tunables.apply(new_source, {"BLOCK_COLS": 256})
    assert "BLOCK_COLS = 256" in changed
    assert inferred.infer(new_source) is None  # declared now
    brief = agents.brief(load_task("gelu"))
    outcome = decide(AgentRequest("tune", brief, source, 1,
                                  last_eval={"status": "correct", "timing": {"host_ratio": 1.0}}))
    assert isinstance(outcome, Proposal) and outcome.kind == "kernel"
    assert outcome.source == new_source


def test_sources_differing_only_in_their_declared_choices_read_the_same() -> None:
    """A widened TUNABLES is the same kernel at the same values: the search's tuning step
    never runs it again (18k's search ran 128 rows twice, once with 256 and 512 added
    to the choices)."""
    source = ('BLOCK_ROWS = 128\nTUNABLES = {"BLOCK_ROWS": [32, 64, 128]}\n'
              "def kernel(x):\n    return x\n")
    wider = tunables.widen(source, {"BLOCK_ROWS": [32, 64, 128, 256, 512]})
    assert wider != source
    assert tunables.menu_free(wider) == tunables.menu_free(source)
    assert tunables.menu_free(tunables.apply(wider, {"BLOCK_ROWS": 64})) != \
        tunables.menu_free(source)
    assert tunables.menu_free("x = 1\n") == "x = 1\n"  # nothing declared
    assert tunables.menu_free("def (:\n") == "def (:\n"  # does not parse


def test_switches_name_declared_tunables() -> None:
    source = SOURCE + 'TUNABLE_SWITCHES = ("MODE",)\n'
    assert tunables.switches(source) == ("MODE",)
    assert tunables.switches(SOURCE) == ()
    with pytest.raises(tunables.TunablesError, match="does not declare: SPEED"):
        tunables.switches(SOURCE + 'TUNABLE_SWITCHES = ("SPEED",)\n')
    with pytest.raises(tunables.TunablesError, match="tuple of tunable names"):
        tunables.switches(SOURCE + 'TUNABLE_SWITCHES = "MODE"\n')
