"""The configuration model: every section, key, type and default in one place.

One TOML file (``config_path``: ``TILEWRIGHT_CONFIG``, else the user config dir) is read
by ``load`` into a frozen ``Config``. Each section is a dataclass below; its field
defaults are the only defaults tilewright has. A key the model does not know, or a
value of the wrong type, is refused with a ``ConfigError`` naming the file, the section
and the key (``config.toml: [budgets] iteratons: unknown key (did you mean
iterations?)``), so a typo never silently falls back to a default. Values are checked against the
fields' types by pydantic in strict mode; the messages are ours.

The environment is read once, by ``Environment.read``, when a ``Config`` is built:
``TILEWRIGHT_MODEL`` replaces ``[agent] model``; ``ANTHROPIC_BASE_URL`` and
``OPENAI_BASE_URL`` are each provider's endpoint when ``[agent] base_url`` is unset.
API keys are not part of the model: they are read where a client is made, so that a
printed or dumped config can never carry one.

It lives in ``agents`` because that is the lowest layer that reads configuration; the
sessions (budgets, controller) and the TUI (keys, theme, chip) read the same object.
Callers may still hand a plain dict (tests, embedding code): ``coerce`` validates it
the same way, with "config" standing for the file name.
"""

from __future__ import annotations

import difflib
import functools
import os
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints


class ConfigError(Exception):
    """A config file that cannot be used: unreadable TOML, an unknown key, a wrong type."""

    next_step = ("fix the file, or point TILEWRIGHT_CONFIG at another one; "
                 "`TILEWRIGHT_CONFIG=/dev/null tilewright config` lists every key "
                 "with its default")


@dataclass(frozen=True)
class AgentConfig:
    """``[agent]``: who proposes and how the model is called."""

    kind: str = "auto"  # auto | offline | anthropic | openai; auto: the provider if usable
    provider: str = "anthropic"  # or openai: any OpenAI-compatible endpoint (base_url)
    model: str | None = None  # None: the provider's default (claude-sonnet-4-6, gpt-4.1)
    base_url: str | None = None  # None: ANTHROPIC_BASE_URL / OPENAI_BASE_URL, else hosted
    max_tokens: int = 8192
    max_retries: int = 4  # total attempts per reply
    retry_base_s: float = 2.0  # first backoff, doubling
    retry_max_s: float = 60.0
    timeout_s: float = 600.0
    followups: int = 2  # follow-up requests after a malformed or missing tool call
    tools: bool = True  # OpenAI-compatible servers without tool support: false
    remember_lessons: bool = False  # offline agent: write lessons of its own tuning runs
    # model or family -> {input, output, cache_read, cache_write} USD per MTok
    prices: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Budgets:
    """``[budgets]``: what one stretch of autonomous mode may spend (false: no limit)."""

    iterations: int | None = 20
    tokens: int | None = 400_000
    cost_usd: float | None = 5.0
    wall_s: float | None = 3600.0


@dataclass(frozen=True)
class ControllerConfig:
    """``[controller]``: the controller's rules (``sessions.autonomy`` uses them)."""

    auto_fix_attempts: int = 2  # step mode: failures sent back to the fixer unasked
    stop_after_no_improvement: int | None = 5
    target_speedup: float | None = None
    propose_after_run: bool = True  # step mode: ask for the next proposal after a run
    max_agent_failures: int = 3  # auto mode: consecutive agent failures before stopping
    # Auto mode profiles each new best version, and any correct one once this many
    # evaluations passed without a profile (None: only new bests); each profile gives a
    # diagnosis that goes into the next request.
    profile_best: bool = True
    profile_every: int | None = 5
    # Every correct evaluation that is not profiled gets the static analysis (no run,
    # about a second) and its diagnosis, so each request carries its version's own.
    analyze_every_version: bool = True
    open_with_plan: bool = False  # step mode: a new session opens by asking for a plan
    record_lessons: bool = True  # write a lesson (agents.memory) when the session ends


@dataclass(frozen=True)
class BackendConfig:
    """``[backend]``: the chip the gauges and roofline use."""

    chip: str | None = None  # None: detect (cpu on hosts without an accelerator)


@dataclass(frozen=True)
class UIConfig:
    """``[ui]``."""

    theme: str = "textual-dark"
    # "auto" (16 colours when the terminal says no more: TERM xterm, linux, vt100),
    # "16", or "full"; with 16, diffs and marks use colour and weight, not backgrounds.
    colors: str = "auto"
    # "auto" (yes on the Linux console and vt terminals), "yes" or "no": an ASCII
    # spinner, borders and marks instead of braille, rounded corners and symbols.
    ascii: str = "auto"


@dataclass(frozen=True)
class Environment:
    """The environment variables that change configuration, read once."""

    model: str | None = None  # TILEWRIGHT_MODEL
    anthropic_base_url: str | None = None  # ANTHROPIC_BASE_URL
    openai_base_url: str | None = None  # OPENAI_BASE_URL

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(name, "").strip() or None

        return cls(get("TILEWRIGHT_MODEL"), get("ANTHROPIC_BASE_URL"), get("OPENAI_BASE_URL"))


@dataclass(frozen=True)
class Config:
    """The whole configuration; ``path`` is the file it came from (None: none read)."""

    agent: AgentConfig = AgentConfig()
    budgets: Budgets = Budgets()
    controller: ControllerConfig = ControllerConfig()
    backend: BackendConfig = BackendConfig()
    # Overrides of kernels.pool.workers.EvalOptions (trials, time_budget_s, timeout_s...),
    # checked against its fields; the defaults are EvalOptions' own.
    eval: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # action id -> keys (tui.keymap)
    ui: UIConfig = UIConfig()
    path: str | None = None
    env: Environment = Environment()

    def base_url(self, provider: str) -> str | None:
        """``[agent] base_url``, else the provider's environment variable."""
        fallback = (self.env.openai_base_url if provider == "openai"
                    else self.env.anthropic_base_url)
        return (self.agent.base_url or "").strip() or fallback

    def to_dict(self) -> dict[str, Any]:
        """The file's sections with their effective values (no path, no environment)."""
        return {name: _plain(getattr(self, name)) for name in SECTIONS}


SECTIONS = ("agent", "budgets", "controller", "backend", "eval", "keys", "ui")


def config_path() -> Path:
    env = os.environ.get("TILEWRIGHT_CONFIG")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("tilewright")) / "config.toml"


def load(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """The user's file (defaults when it does not exist), validated, with the
    environment applied; anything wrong is a ``ConfigError`` naming file, section, key."""
    path = path or config_path()
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot be read: {exc}") from exc
    return from_dict(data, source=str(path), path=str(path), environ=environ)


def coerce(config: Config | Mapping[str, Any] | None) -> Config:
    """A ``Config`` as it is, or a dict (possibly partial) validated into one."""
    if isinstance(config, Config):
        return config
    return from_dict(dict(config or {}), source="config")


def from_dict(data: Mapping[str, Any], *, source: str = "config", path: str | None = None,
              environ: Mapping[str, str] | None = None) -> Config:
    data = {k: v for k, v in data.items() if k != "_path"}  # older in-memory dicts
    for name, value in data.items():
        if name not in SECTIONS:
            what = "section" if isinstance(value, dict) else "key at the top level"
            raise ConfigError(f"{source}: [{name}]: unknown {what}{_did_you_mean(name, SECTIONS)}"
                              f"; the sections are {', '.join(f'[{s}]' for s in SECTIONS)}")
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: {name}: must be a table ([{name}]), "
                              f"got {_describe(value)}")
    hints = get_type_hints(Config)
    sections: dict[str, Any] = {}
    for name in SECTIONS:
        table = dict(data.get(name) or {})
        if name == "eval":
            sections[name] = _eval_table(table, source)
        elif name == "keys":
            sections[name] = {k: _check(str, v, source, name, k) for k, v in table.items()}
        else:
            sections[name] = _section(hints[name], table, source, name)
    env = Environment.read(environ)
    if env.model:
        sections["agent"] = _replace(sections["agent"], model=env.model)
    return Config(**sections, path=path, env=env)


def _section(cls: type, table: dict[str, Any], source: str, section: str) -> Any:
    hints = get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    values = {}
    for key, value in table.items():
        if key not in hints:
            raise ConfigError(f"{source}: [{section}] {key}: unknown key"
                              f"{_did_you_mean(key, known)}; known: {', '.join(known)}")
        values[key] = _check(hints[key], value, source, section, key)
    return cls(**values)


# ``[eval]`` keys and their types: kernels.pool.workers.EvalOptions' fields, whose defaults stay
# there. Not imported from it: that module reaches the worker side (JAX), which the app
# layers must never import; tests/test_config.py keeps the two in step.
EVAL_KEYS: dict[str, Any] = {
    "trials": int, "iters": int | None, "timeout_s": float, "time_budget_s": float,
    "lowering": bool, "timing": bool, "shapes": list[str] | None, "chip": str | None,
    "compile_memory_mb": int | None, "route": str | None, "estimate_on_tpu": bool,
}


def _eval_table(table: dict[str, Any], source: str) -> dict[str, Any]:
    hints, known = EVAL_KEYS, list(EVAL_KEYS)
    out = {}
    for key, value in table.items():
        if key not in hints:
            raise ConfigError(f"{source}: [eval] {key}: unknown key"
                              f"{_did_you_mean(key, known)}; known: {', '.join(known)}")
        out[key] = _check(hints[key], value, source, "eval", key)
    return out


def _check(hint: Any, value: Any, source: str, section: str, key: str) -> Any:
    """``value`` as ``hint`` wants it, or a ConfigError saying what was expected."""
    args = get_args(hint)
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in args
    if optional:
        inner = next(a for a in args if a is not type(None))
        # TOML has no null: ``false`` switches an optional limit off, as it always has.
        if value is None or (value is False and inner in (int, float)):
            return None
        hint = inner
    ok = _convert(hint, value)
    if ok is _BAD:
        wanted = _expected(hint) + (" (or false for none)" if optional and hint in (int, float)
                                    else "")
        raise ConfigError(f"{source}: [{section}] {key}: expected {wanted}, "
                          f"got {_describe(value)}")
    return ok


_BAD = object()


def _convert(hint: Any, value: Any) -> Any:
    """``value`` validated as ``hint`` by pydantic in strict mode (no string to number,
    no boolean as a number; a whole number is a float where a float is wanted), or
    ``_BAD``."""
    from pydantic import ValidationError

    try:
        return _adapter(hint).validate_python(value, strict=True)
    except ValidationError:
        return _BAD


@functools.cache
def _adapter(hint: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(hint)


def _expected(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    origin, args = get_origin(hint), get_args(hint)
    if origin is list:
        return f"a list of {_plural(_expected(args[0]))}"
    if origin is dict:
        return f"a table of {_plural(_expected(args[1]))}"
    return str(hint)


def _plural(what: str) -> str:
    """"a table of numbers" -> "tables of numbers"; "an integer" -> "integers"."""
    head, _, rest = what.removeprefix("a ").removeprefix("an ").partition(" ")
    return f"{head}s {rest}".strip()


def _describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)
    shown = repr(value) if not isinstance(value, dict | list) else ""
    return f"{kind} {shown}".strip()


def _did_you_mean(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _replace(obj: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(obj, **changes)


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
