"""The /v1 routes' tenant API keys (completion, infill, jobs, knowledge-base administration):
`Authorization: Bearer <key>` of a tenant (configs/tenants.yaml) or of COMPLETION_API_KEYS, and
OpenAI's error body for every error those routes raise."""
from __future__ import annotations

import hmac

from flask import Blueprint, current_app, g, jsonify, request

from app.schemas import ApiError, error_responses
from app.tenants import hash_api_key
from httpkit.errors import OpenAIError

API_ERRORS = error_responses(ApiError, 400, 401, 413, 429, 503)   # every authenticated route
OPEN_PATHS = ("/v1/health", "/v1/metrics")                        # GET without a key


def openai_error(exc: OpenAIError):
    return jsonify(exc.body()), exc.status, exc.headers


def require_api_key():
    """Before each request: 401 without a known key; g.api_tenant names the key's tenant
    ("default" for a COMPLETION_API_KEYS key)."""
    if request.path in OPEN_PATHS and request.method == "GET":
        return None
    header = request.headers.get("Authorization", "")
    token = header[7:] if header.startswith("Bearer ") else ""
    if not token:
        raise OpenAIError(401, "missing Authorization: Bearer <api key>")
    tenant = current_app.extensions["support_chat"]["tenants"].by_api_key(token)
    digest = hash_api_key(token).encode()
    env_ok = any(hmac.compare_digest(digest, h.encode()) for h in current_app.config["COMPLETION_API_KEY_HASHES"])
    if tenant is None and not env_ok:
        raise OpenAIError(401, "invalid API key")
    g.api_tenant = tenant.tenant.tenant_id if tenant is not None else "default"
    return None


def api_key_routes(bp: Blueprint) -> Blueprint:
    """The blueprint with the key check before each request and OpenAI's error bodies."""
    bp.before_request(require_api_key)
    bp.register_error_handler(OpenAIError, openai_error)
    return bp
