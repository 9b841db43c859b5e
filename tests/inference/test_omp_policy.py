"""torch's OpenMP threads must not spin against the CPU kernels' own pool (inference/__init__.py):
`import inference` and `import app` set OMP_WAIT_POLICY=PASSIVE before torch loads, and leave a
value the user set alone."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def policy_after(module: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    code = (f"import {module}, os, sys; "
            "assert 'torch' not in sys.modules, 'torch loaded before the policy could apply'; "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("module", ["inference", "app"])
def test_passive_by_default(module):
    assert policy_after(module, None) == "PASSIVE"


def test_a_users_choice_is_kept():
    assert policy_after("inference", "ACTIVE") == "ACTIVE"
