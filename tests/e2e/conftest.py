"""End-to-end suites: real processes (servers, Celery workers, Prometheus, a browser) wired as a
deployment would be, and bounded soak / fault loops. Each test here carries the `e2e` marker, so
`pytest -m "not e2e"` runs the unit and component tests alone."""
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)
