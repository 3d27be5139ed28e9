"""The config model (agents.config): one set of defaults, typos and wrong types refused
with the file, section and key, the environment applied once; through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import get_type_hints

import pytest

from tilewright.agents import make_agent
from tilewright.agents.config import EVAL_KEYS, Config, ConfigError, coerce, load
from tilewright.sessions.autonomy import ControllerSettings

ROOT = Path(__file__).resolve().parent.parent


def _tw(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"TILEWRIGHT_CONFIG": str(config), "PATH": "/usr/bin:/bin",
           "HOME": str(config.parent), "JAX_PLATFORMS": "cpu", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args", [("config",), ("--task", "softmax"), ("auto", "--task", "gelu")],
                         ids=["config", "tui", "headless"])
def test_an_unknown_key_is_refused_naming_file_section_and_key(tmp_path: Path,
                                                                args: tuple[str, ...]) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[budgets]\niteratons = 3\n")
    out = _tw(config, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert (f"{config}: [budgets] iteratons: unknown key (did you mean iterations?)"
            in out.stderr)
    assert "TILEWRIGHT_CONFIG" in out.stderr  # the next step
    assert "Traceback" not in out.stderr and out.stdout == ""


@pytest.mark.parametrize("args", [("config",), ("--task", "softmax"), ("auto", "--task", "gelu")],
                         ids=["config", "tui", "headless"])
def test_a_wrong_type_is_refused_naming_file_section_and_key(tmp_path: Path,
                                                              args: tuple[str, ...]) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[agent]\nmax_tokens = "lots"\n')
    out = _tw(config, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert (f"{config}: [agent] max_tokens: expected an integer, got a string 'lots'"
            in out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_what_config_prints_loads_back_as_the_same_values(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[budgets]\niterations = 7\ncost_usd = false\n'
                      '[agent.prices."my-model"]\ninput = 1\noutput = 2.5\n'
                      '[eval]\ntrials = 1\nshapes = ["small"]\n')
    out = _tw(config, "config")
    assert out.returncode == 0, out.stderr
    assert "iterations = 7" in out.stdout and "cost_usd = false" in out.stdout
    printed = tmp_path / "printed.toml"
    printed.write_text(out.stdout)
    again, first = load(printed, environ={}), load(config, environ={})
    assert again.keys["approve"] == "ctrl+y"  # the keymap's defaults are printed too
    assert {**again.to_dict(), "keys": {}} == first.to_dict()
    assert first.budgets.cost_usd is None and first.agent.prices["my-model"]["input"] == 1.0


def test_sections_keys_and_types_are_checked(tmp_path: Path) -> None:
    cases = {
        "[budget]\niterations = 3\n": "[budget]: unknown section (did you mean budgets?)",
        "iterations = 3\n": "[iterations]: unknown key at the top level",
        "budgets = 3\n": "budgets: must be a table ([budgets]), got an integer 3",
        "[controller]\nauto_fix_attempts = true\n":
            "[controller] auto_fix_attempts: expected an integer, got a boolean True",
        "[controller]\ntarget_speedup = \"2x\"\n":
            "[controller] target_speedup: expected a number (or false for none)",
        "[eval]\ntrails = 2\n": "[eval] trails: unknown key (did you mean trials?)",
        "[eval]\nshapes = [1]\n": "[eval] shapes: expected a list of strings",
        "[keys]\napprove = 5\n": "[keys] approve: expected a string, got an integer 5",
        "[agent.prices]\nx = 3\n": "[agent] prices: expected a table of tables of numbers",
        "[agent\n": "not valid TOML",
    }
    path = tmp_path / "config.toml"
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load(path, environ={})
        assert str(info.value).startswith(f"{path}: ") and message in str(info.value), text


def test_the_environment_is_applied_where_the_config_is_built(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[agent]\nmodel = "from-file"\n')
    env = {"TILEWRIGHT_MODEL": "from-env", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    config = load(path, environ=env)
    assert config.agent.model == "from-env" and config.path == str(path)
    assert config.base_url("openai") == "http://127.0.0.1:9/v1"
    assert config.base_url("anthropic") is None
    assert load(tmp_path / "missing.toml", environ={}) == Config(
        path=str(tmp_path / "missing.toml"))


def test_one_set_of_defaults_for_every_reader(monkeypatch) -> None:
    for name in ("TILEWRIGHT_MODEL", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    defaults = Config()
    settings = ControllerSettings.from_config({})
    assert settings == ControllerSettings()
    assert settings.budgets == defaults.budgets
    assert settings.auto_fix_attempts == defaults.controller.auto_fix_attempts
    assert ControllerSettings.from_config({"budgets": {"iterations": False}}).budgets \
        .iterations is None
    # A dict handed to a reader is validated like the file ("config" names it).
    with pytest.raises(ConfigError, match=r"^config: \[agent\] max_retrys: unknown key "
                                          r"\(did you mean max_retries\?\)"):
        make_agent("offline", {"agent": {"max_retrys": 2}})
    assert coerce(defaults) is defaults


def test_eval_keys_follow_eval_options() -> None:
    from tilewright.kernels.judge.options import REQUEST_ONLY
    from tilewright.kernels.pool.workers import EvalOptions

    hints = get_type_hints(EvalOptions)
    assert list(EVAL_KEYS) == [f.name for f in fields(EvalOptions)
                               if f.name not in REQUEST_ONLY]
    assert all(EVAL_KEYS[name] == hints[name] for name in EVAL_KEYS)
    assert os.environ.get("TILEWRIGHT_CONFIG")  # conftest isolates the user's file
