"""The configuration model: every section, key, type and default in one place.

One TOML file (``config_path``: ``TILEWRIGHT_CONFIG``, else the user config dir) is read
by ``load`` into a frozen ``Config``. The file is the pydantic model ``Sections``, one
model per section below (``[eval]`` and ``[keys]`` are plain tables of known types), and
their field defaults are the only defaults tilewright has. The whole file is validated
by one ``model_validate`` in strict mode (no string to number, no boolean as a number; a
whole number is a float where a float is wanted) with unknown keys forbidden; each of
pydantic's errors becomes a ``ConfigError`` line naming the file, the section and the key
(``config.toml: [budgets] iteratons: unknown key (did you mean iterations?)``), so a typo
never silently falls back to a default.

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
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin, get_type_hints

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from typing_extensions import TypedDict


class ConfigError(Exception):
    """A config file that cannot be used: unreadable TOML, an unknown key, a wrong type."""

    next_step = ("fix the file, or point TILEWRIGHT_CONFIG at another one; "
                 "`TILEWRIGHT_CONFIG=/dev/null tilewright config` lists every key "
                 "with its default")


_STRICT = ConfigDict(extra="forbid", strict=True)
# TOML has no null: ``false`` leaves an optional number unset (a limit switched off).
_OFF = BeforeValidator(lambda value: None if value is False else value)
OptionalInt = Annotated[int | None, _OFF]
OptionalFloat = Annotated[float | None, _OFF]


class _Section(BaseModel):
    model_config = ConfigDict(**_STRICT, frozen=True)


class AgentConfig(_Section):
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
    prices: dict[str, dict[str, float]] = {}


class Budgets(_Section):
    """``[budgets]``: what one stretch of autonomous mode may spend (false: no limit)."""

    iterations: OptionalInt = 20
    tokens: OptionalInt = 400_000
    cost_usd: OptionalFloat = 5.0
    wall_s: OptionalFloat = 3600.0


class ControllerConfig(_Section):
    """``[controller]``: the controller's rules (``sessions.autonomy`` uses them)."""

    auto_fix_attempts: int = 2  # step mode: failures sent back to the fixer unasked
    stop_after_no_improvement: OptionalInt = 5
    target_speedup: OptionalFloat = None
    propose_after_run: bool = True  # step mode: ask for the next proposal after a run
    max_agent_failures: int = 3  # auto mode: consecutive agent failures before stopping
    # Auto mode profiles each new best version, and any correct one once this many
    # evaluations passed without a profile (None: only new bests); each profile gives a
    # diagnosis that goes into the next request.
    profile_best: bool = True
    profile_every: OptionalInt = 5
    # Every correct evaluation that is not profiled gets the static analysis (no run,
    # about a second) and its diagnosis, so each request carries its version's own.
    analyze_every_version: bool = True
    open_with_plan: bool = False  # step mode: a new session opens by asking for a plan
    record_lessons: bool = True  # write a lesson (agents.memory) when the session ends


class BackendConfig(_Section):
    """``[backend]``: the chip the gauges and roofline use."""

    chip: str | None = None  # None: detect (cpu on hosts without an accelerator)


class UIConfig(_Section):
    """``[ui]``."""

    theme: str = "textual-dark"
    # "auto" (16 colours when the terminal says no more: TERM xterm, linux, vt100),
    # "16", or "full"; with 16, diffs and marks use colour and weight, not backgrounds.
    colors: str = "auto"
    # "auto" (yes on the Linux console and vt terminals), "yes" or "no": an ASCII
    # spinner, borders and marks instead of braille, rounded corners and symbols.
    ascii: str = "auto"


# ``[eval]`` keys and their types: kernels.pool.workers.EvalOptions' fields, whose defaults stay
# there. Not imported from it: that module reaches the worker side (JAX), which the app
# layers must never import; tests/test_config.py keeps the two in step.
EVAL_KEYS: dict[str, Any] = {
    "trials": int, "iters": int | None, "timeout_s": float, "time_budget_s": float,
    "lowering": bool, "timing": bool, "shapes": list[str] | None, "chip": str | None,
    "compile_memory_mb": int | None, "route": str | None, "estimate_on_tpu": bool,
}
# ``[eval]`` as validated: a dict of the keys given (overrides of EvalOptions' defaults).
EvalTable = TypedDict("EvalTable", {  # type: ignore[misc]
    key: Annotated[hint, _OFF] if hint in (int | None, float | None) else hint
    for key, hint in EVAL_KEYS.items()}, total=False)
EvalTable.__pydantic_config__ = _STRICT  # type: ignore[attr-defined]


class Sections(_Section):
    """The file: its sections, each a table."""

    agent: AgentConfig = AgentConfig()
    budgets: Budgets = Budgets()
    controller: ControllerConfig = ControllerConfig()
    backend: BackendConfig = BackendConfig()
    # Overrides of kernels.pool.workers.EvalOptions (trials, time_budget_s, timeout_s...),
    # checked against its fields; the defaults are EvalOptions' own.
    eval: EvalTable = {}
    keys: dict[str, str] = {}  # action id -> keys (tui.keymap)
    ui: UIConfig = UIConfig()


SECTIONS = tuple(Sections.model_fields)


class Environment(_Section):
    """The environment variables that change configuration, read once."""

    model: str | None = None  # TILEWRIGHT_MODEL
    anthropic_base_url: str | None = None  # ANTHROPIC_BASE_URL
    openai_base_url: str | None = None  # OPENAI_BASE_URL

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(name, "").strip() or None

        return cls(model=get("TILEWRIGHT_MODEL"), anthropic_base_url=get("ANTHROPIC_BASE_URL"),
                   openai_base_url=get("OPENAI_BASE_URL"))


class Config(Sections):
    """The whole configuration; ``path`` is the file it came from (None: none read)."""

    path: str | None = None
    env: Environment = Environment()

    def base_url(self, provider: str) -> str | None:
        """``[agent] base_url``, else the provider's environment variable."""
        fallback = (self.env.openai_base_url if provider == "openai"
                    else self.env.anthropic_base_url)
        return (self.agent.base_url or "").strip() or fallback

    def to_dict(self) -> dict[str, Any]:
        """The file's sections with their effective values (no path, no environment)."""
        return self.model_dump(include=set(SECTIONS))


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
    # plain dicts all the way down (the models are strict: a read-only mapping given for
    # a section is a table all the same); "_path": older in-memory dicts
    data = {k: _plain(v) for k, v in data.items() if k != "_path"}
    try:
        sections = Sections.model_validate(data)
    except ValidationError as exc:  # every error, each once (a key's parts are one key)
        lines = dict.fromkeys(f"{source}: {_message(e, data)}" for e in exc.errors())
        raise ConfigError("\n".join(lines)) from None
    env = Environment.read(environ)
    agent = sections.agent.model_copy(update={"model": env.model or sections.agent.model})
    return Config(**{**vars(sections), "agent": agent}, path=path, env=env)


def _plain(value: Any) -> Any:
    return {k: _plain(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def _message(error: Any, data: dict[str, Any]) -> str:
    """One of pydantic's errors in our words, from its ``loc``: section, key, expected."""
    section, *rest = map(str, error["loc"])
    unknown = error["type"] == "extra_forbidden"
    if not rest and unknown:
        what = "section" if isinstance(error["input"], dict) else "key at the top level"
        return (f"[{section}]: unknown {what}{_did_you_mean(section, SECTIONS)}"
                f"; the sections are {', '.join(f'[{s}]' for s in SECTIONS)}")
    if not rest:
        return f"{section}: must be a table ([{section}]), got {_describe(error['input'])}"
    key, table = rest[0], Sections.model_fields[section].annotation
    if unknown:
        known = list(getattr(table, "model_fields", None) or get_type_hints(table))
        return (f"[{section}] {key}: unknown key{_did_you_mean(key, known)}"
                f"; known: {', '.join(known)}")
    hint = (get_args(table)[1] if get_origin(table) is dict
            else get_type_hints(table, include_extras=True)[key])
    return f"[{section}] {key}: expected {_expected(hint)}, got {_describe(data[section][key])}"


def _expected(hint: Any) -> str:
    """What a key's type wants, in words ("an integer (or false for none)")."""
    metadata = getattr(hint, "__metadata__", ())
    args = get_args(get_args(hint)[0] if metadata else hint)
    if type(None) in args:  # optional: the other type, and false where it means none
        inner = _expected(next(a for a in args if a is not type(None)))
        return inner + (" (or false for none)" if _OFF in metadata else "")
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    if get_origin(hint) is list:
        return f"a list of {_plural(_expected(args[0]))}"
    if get_origin(hint) is dict:
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
