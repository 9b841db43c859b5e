"""Schemathesis over an app's /openapi.json, driven from plain pytest tests: every documented
operation, valid cases and (negative mode) cases the spec calls invalid, each response checked for
no 5xx and for a documented status, content type and body; data the spec rejects must get a 4xx."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]


def fuzz(schema, examples: int, prepare: Callable, headers: dict, select: Callable[[str], bool] = lambda p: True,
         after: Callable = lambda case, response: None) -> Counter:
    """Run up to `examples` cases per operation and mode; returns cases run per "METHOD path".
    `prepare(case)` may point a valid case at a live resource before it is sent."""
    counts: Counter = Counter()
    for result in schema.get_all_operations():
        op = result.ok()
        if not select(op.path):
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=op.as_strategy(mode))
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def run(case):
                prepare(case)
                counts[case.operation.label] += 1
                response = case.call_and_validate(headers=headers, checks=CHECKS)
                after(case, response)
            try:
                run()
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    raise
                # an operation with no input (GET /health) has nothing to make invalid
    return counts
