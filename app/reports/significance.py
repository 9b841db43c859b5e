"""The statistics of an A/B test's results (app/reports/experiments.py, bench/cpu/experiments_sim.py):
rates with Wilson score intervals, and the difference of two rates with a two-sided two-proportion
z-test (pooled standard error) and a 95% Wald interval (unpooled)."""
from __future__ import annotations

import math

Z95 = 1.959963984540054


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a rate, or None with no trials."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def two_proportions(x1: int, n1: int, x2: int, n2: int, z: float = Z95) -> dict | None:
    """Arm 2 against arm 1: the difference of rates (p2 - p1), its interval, and the two-sided
    p-value of a two-proportion z-test. None while either arm has no trials."""
    if n1 <= 0 or n2 <= 0:
        return None
    p1, p2 = x1 / n1, x2 / n2
    pooled = (x1 + x2) / (n1 + n2)
    se_pooled = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    diff = p2 - p1
    p_value = 1.0 if se_pooled == 0 else 2 * normal_sf(abs(diff) / se_pooled)
    return {"difference": diff, "ci_low": diff - z * se, "ci_high": diff + z * se, "p_value": min(1.0, p_value)}


def required_per_arm(p1: float, p2: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Conversations per arm for a two-sided test at `alpha` to detect p1 -> p2 with `power`
    (the normal approximation every A/B calculator uses)."""
    z_a = _z(1 - alpha / 2)
    z_b = _z(power)
    pbar = (p1 + p2) / 2
    num = (z_a * math.sqrt(2 * pbar * (1 - pbar)) + z_b * math.sqrt(p1 * (1 - p1) + p2 * (1 - p2))) ** 2
    return math.ceil(num / (p2 - p1) ** 2)


def _z(q: float) -> float:
    """The standard normal quantile, by bisection on normal_sf (exact enough for sample sizes)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 1 - normal_sf(mid) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
