"""The user's configuration file: where it lives, its defaults, and how it is merged.

One TOML file in the user config dir (``platformdirs``), or ``TILEWRIGHT_CONFIG``.
Sections: ``[agent]`` (kind, provider, model, base_url, price table, limits), ``[budgets]``,
``[backend]`` (chip), ``[keys]`` (keymap), ``[ui]`` (theme). Values are plain dicts
handed down to the lower layers, which never read the file themselves.
"""

from __future__ import annotations

import copy
import os
import tomllib
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "agent": {
        "kind": "auto",  # auto: the provider when it is usable (a key, or a local server), else offline
        "provider": "anthropic",  # or openai: any OpenAI-compatible endpoint (base_url)
        "model": None,  # None: the provider's default (claude-sonnet-4-6, gpt-4.1)
        "max_tokens": 8192,
        "max_retries": 4,
        "prices": {},  # model -> {input, output, cache_read, cache_write} USD per MTok
    },
    "budgets": {"iterations": 20, "tokens": 400_000, "cost_usd": 5.0, "wall_s": 3600},
    "controller": {"auto_fix_attempts": 2, "stop_after_no_improvement": 5,
                   "target_speedup": None},
    "backend": {"chip": None},  # None: detect (cpu on hosts without an accelerator)
    "keys": {},
    "ui": {"theme": "textual-dark"},
}


class ConfigError(Exception):
    pass


def config_path() -> Path:
    env = os.environ.get("TILEWRIGHT_CONFIG")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("tilewright")) / "config.toml"


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load(path: Path | None = None) -> dict[str, Any]:
    """Defaults merged with the user's file; a broken file is a clear error, not a crash."""
    path = path or config_path()
    config = copy.deepcopy(DEFAULTS)
    if path.exists():
        try:
            user = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        config = _merge(config, user)
    model = os.environ.get("TILEWRIGHT_MODEL")
    if model:
        config["agent"]["model"] = model
    config["_path"] = str(path)
    return config
