"""Tenants: site keys, allowed widget origins and per-tenant prompts, from configs/tenants.yaml."""
from __future__ import annotations

import fnmatch
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipelines.support_chat import Tenant

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "configs" / "tenants.yaml"


@dataclass(frozen=True)
class TenantConfig:
    tenant: Tenant
    site_key: str
    allowed_origins: tuple[str, ...]

    def allows_origin(self, origin: str) -> bool:
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.allowed_origins)


class TenantRegistry:
    def __init__(self, path: str | os.PathLike | None = None):
        path = Path(path or os.environ.get("TENANTS_PATH") or DEFAULT_PATH)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"tenants: cannot read {path}: {exc}") from exc
        self.tenants: list[TenantConfig] = []
        for tid, spec in (data.get("tenants") or {}).items():
            if not isinstance(spec, dict) or not spec.get("site_key") or not spec.get("system_prompt"):
                raise ValueError(f"tenants: {tid!r} needs a site_key and a system_prompt")
            policy = spec.get("banned_input_policy", "block")
            if policy not in ("block", "mask"):
                raise ValueError(f"tenants: {tid!r} banned_input_policy must be block or mask, got {policy!r}")
            self.tenants.append(TenantConfig(
                Tenant(str(tid), spec.get("name", str(tid)), spec["system_prompt"], policy),
                str(spec["site_key"]), tuple(spec.get("allowed_origins") or ())))
        if not self.tenants:
            raise ValueError(f"tenants: {path} defines no tenants")

    def by_site_key(self, key: str) -> TenantConfig | None:
        for t in self.tenants:
            if hmac.compare_digest(t.site_key.encode(), key.encode()):
                return t
        return None

    def any_allows_origin(self, origin: str) -> bool:
        return any(t.allows_origin(origin) for t in self.tenants)
