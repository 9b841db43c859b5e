"""A/B experiments of the support chat for the agent console (same session and CSRF rules as
app/agent/api.py); assignment in app/store/experiments.py, results in app/reports/experiments.py.

    GET  /api/agent/experiments              the tenant's experiments with each arm's results
    POST /api/agent/experiments              {"name", "factor", "arms": [{"name", "weight", "value"}]}
    POST /api/agent/experiments/<id>/stop
"""
from __future__ import annotations

import datetime as dt

from flask import Blueprint, current_app, jsonify, request

from app.agent.auth import agent_required, current_agent
from app.agent.experiment_schemas import ExperimentIn, ExperimentList, ExperimentOut, ExperimentPath
from app.errors import PlainError, render, validate_body
from app.reports.experiments import arm_results
from app.schemas import Error, error_responses
from app.store.handoffs import Conflict, NotFound
from httpkit.openapi import documented

bp = Blueprint("agent_experiments", __name__, url_prefix="/api/agent/experiments")
bp.register_error_handler(PlainError, render)
bp.before_request(agent_required)
_ERRORS = error_responses(Error, 400, 401, 429, 503)


def _store():
    return current_app.extensions["experiments"]


def _with_results(tenant: str, experiment: dict) -> dict:
    window = dt.timedelta(hours=current_app.config["RESOLUTION_WINDOW_H"])
    return {**experiment, "results": arm_results(current_app.extensions["db"], tenant, experiment, window)}


@bp.get("")
@documented(responses={200: ExperimentList, **_ERRORS}, tags=("agent",))
def experiments():
    """The tenant's experiments, newest first, each arm's results beside the control's."""
    tenant = current_agent().tenant_id
    return jsonify({"experiments": [_with_results(tenant, e) for e in _store().list(tenant)[:20]]})


@bp.post("")
@documented(body=ExperimentIn, responses={201: ExperimentOut, **_ERRORS, **error_responses(Error, 409)},
            tags=("agent",))
def start():
    """Start an experiment: new conversations are split between the arms by weight (sticky per
    conversation); each arm sets the factor to its value. One runs per tenant at a time (409)."""
    body = validate_body(ExperimentIn, request.get_json(silent=True))
    arms = [{"name": a.name, "weight": a.weight, "value": a.value} for a in body.arms]
    try:
        started = _store().start(current_agent().tenant_id, body.name.strip(), body.factor, arms)
    except Conflict as exc:
        raise PlainError(409, str(exc)) from None
    return jsonify(started), 201


@bp.post("/<int:experiment_id>/stop")
@documented(path=ExperimentPath, responses={200: ExperimentOut, **_ERRORS, **error_responses(Error, 404, 409)},
            tags=("agent",))
def stop(experiment_id: int):
    """Stop assigning conversations; the results stay."""
    tenant = current_agent().tenant_id
    try:
        stopped = _store().stop(tenant, experiment_id)
    except NotFound:
        raise PlainError(404, f"unknown experiment {experiment_id}") from None
    except Conflict as exc:
        raise PlainError(409, str(exc)) from None
    return jsonify(_with_results(tenant, stopped))
