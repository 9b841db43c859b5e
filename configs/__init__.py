"""The product's configuration files, shipped as package data, and the one place that resolves
them: an explicit path wins, then the file named by an environment variable, then the shipped
default under this directory."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent


def shipped(*parts: str) -> Path:
    """A shipped file or directory, e.g. shipped("profiles", "balanced.yaml")."""
    return CONFIG_DIR.joinpath(*parts)


def resolve(name: str, path: str | os.PathLike | None = None, env_var: str | None = None,
            env: Mapping[str, str] | None = None) -> Path:
    """`path` if given, else $env_var if set and non-empty, else the shipped configs/<name>."""
    if path:
        return Path(path)
    env = os.environ if env is None else env
    if env_var and env.get(env_var):
        return Path(env[env_var])
    return shipped(name)


def read_yaml(label: str, name: str, path: str | os.PathLike | None = None,
              env_var: str | None = None) -> tuple[Path, dict]:
    """(the resolved path, its YAML mapping); a file that cannot be read or parsed raises
    ValueError("<label>: cannot read <path>: ...")."""
    import yaml
    where = resolve(name, path, env_var)
    try:
        data = yaml.safe_load(where.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{label}: cannot read {where}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{label}: {where} must hold a YAML mapping, got {type(data).__name__}")
    return where, data
