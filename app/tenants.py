"""Tenants: site keys, allowed widget origins, per-tenant prompts, hashed API keys and the actions
file a tenant names (`actions:`, pipelines/actions.py), from configs/tenants.yaml. API keys are
never stored: only `sha256:<hex>` of each, compared in constant time against the hash of the key
a request presents."""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from app.business_hours import BusinessHours, parse_hours
from configs import read_yaml, shipped
from pipelines.actions import load_actions
from pipelines.grounded_answer import ANSWER_MODES
from pipelines.support_chat import Tenant

DEFAULT_PATH = shipped("tenants.yaml")


_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def hash_api_key(key: str) -> str:
    """What tenants.yaml stores for an API key."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _beside(tenants_file: Path, name: str) -> Path:
    """A file a tenant names: absolute, beside the tenants file, or shipped under configs/."""
    path = Path(name)
    if path.is_absolute():
        return path
    return tenants_file.parent / path if (tenants_file.parent / path).exists() else shipped(name)


@dataclass(frozen=True)
class TenantConfig:
    tenant: Tenant
    site_key: str
    allowed_origins: tuple[str, ...]
    api_key_hashes: tuple[str, ...] = field(default=(), repr=False)
    hours: BusinessHours | None = None              # None: always open (app/business_hours.py)

    def allows_origin(self, origin: str) -> bool:
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.allowed_origins)


class TenantRegistry:
    def __init__(self, path: str | os.PathLike | None = None):
        path, data = read_yaml("tenants", "tenants.yaml", path, "TENANTS_PATH")
        self.tenants: list[TenantConfig] = []
        for tid, spec in (data.get("tenants") or {}).items():
            if not isinstance(spec, dict) or not spec.get("site_key") or not spec.get("system_prompt"):
                raise ValueError(f"tenants: {tid!r} needs a site_key and a system_prompt")
            policy = spec.get("banned_input_policy", "block")
            if policy not in ("block", "mask"):
                raise ValueError(f"tenants: {tid!r} banned_input_policy must be block or mask, got {policy!r}")
            mode = spec.get("answer_mode", "extractive")
            if mode not in ANSWER_MODES:
                raise ValueError(f"tenants: {tid!r} answer_mode must be one of {', '.join(ANSWER_MODES)}, got {mode!r}")
            hashes = tuple(spec.get("api_keys") or ())
            bad = [h for h in hashes if not isinstance(h, str) or not _HASH.match(h)]
            if bad:
                raise ValueError(f"tenants: {tid!r} api_keys must be 'sha256:<64 hex>' hashes (python -m app "
                                 f"hash-key KEY), not keys; got {len(bad)} other value(s)")
            actions = load_actions(_beside(path, spec["actions"])) if spec.get("actions") else ()
            self.tenants.append(TenantConfig(
                Tenant(str(tid), spec.get("name", str(tid)), spec["system_prompt"], policy, mode, actions),
                str(spec["site_key"]), tuple(spec.get("allowed_origins") or ()), hashes,
                parse_hours(spec.get("business_hours"), f"tenants: {tid!r}")))
        if not self.tenants:
            raise ValueError(f"tenants: {path} defines no tenants")

    def by_site_key(self, key: str) -> TenantConfig | None:
        for t in self.tenants:
            if hmac.compare_digest(t.site_key.encode(), key.encode()):
                return t
        return None

    def by_id(self, tenant_id: str) -> TenantConfig | None:
        return next((t for t in self.tenants if t.tenant.tenant_id == tenant_id), None)

    def by_api_key(self, key: str) -> TenantConfig | None:
        """The tenant whose api_keys hold this key's hash (every entry compared: no early exit)."""
        digest = hash_api_key(key).encode()
        found = None
        for t in self.tenants:
            for h in t.api_key_hashes:
                if hmac.compare_digest(digest, h.encode()):
                    found = t
        return found

    def any_allows_origin(self, origin: str) -> bool:
        return any(t.allows_origin(origin) for t in self.tenants)
