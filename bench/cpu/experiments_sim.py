"""The A/B test's statistics under simulated traffic with a known truth.

Each simulated experiment sends N conversations through the product's own assignment
(`pick_arm`: the hash of experiment and conversation ids on the arms' weights), draws each
conversation's outcome (resolved or not) with its arm's true resolution rate, and tests the arms
with the product's own two-proportion z-test (`two_proportions`, alpha 0.05), as the results
endpoint does. Two scenarios, --runs experiments each:
  - A/B: the treatment resolves +10 points more (0.50 -> 0.60): the share of runs that call it
    significant is the test's power;
  - A/A: both arms at 0.50: the share of runs that call a difference is the false-alarm rate.
The peer is the textbook: the normal-approximation power for the same N, and alpha itself. N
defaults to the conversations per arm that the normal approximation asks for (80% power).

Prints a table, writes bench/results/experiments_sim.json.

    python -m bench.cpu.experiments_sim [--runs 2000] [--per-arm N] [--seed 1]
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from app.reports.significance import normal_sf, required_per_arm, two_proportions
from app.store.experiments import pick_arm
from bench.harness import cpu_model, git_commit, log, result_path, write_result

ALPHA = 0.05
ARMS = [{"name": "control", "weight": 0.5, "value": "extractive"},
        {"name": "treatment", "weight": 0.5, "value": "grounded_generation"}]


def expected_power(p1: float, p2: float, n1: int, n2: int, alpha: float = ALPHA) -> float:
    """The normal approximation's power of the two-sided test at these arm sizes."""
    pbar = (p1 * n1 + p2 * n2) / (n1 + n2)
    se0 = math.sqrt(pbar * (1 - pbar) * (1 / n1 + 1 / n2))
    se1 = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    z = 1.959963984540054
    d = abs(p2 - p1)
    return normal_sf((z * se0 - d) / se1) + normal_sf((z * se0 + d) / se1)


def simulate(p_control: float, p_treatment: float, conversations: int, runs: int, rng: np.random.Generator,
             first_id: int) -> dict:
    called, sizes = 0, []
    for run in range(runs):
        ids = rng.integers(0, 2 ** 63, size=conversations)
        arms = np.array([pick_arm(first_id + run, f"{i:x}", ARMS) == "treatment" for i in ids])
        rates = np.where(arms, p_treatment, p_control)
        resolved = rng.random(conversations) < rates
        n2 = int(arms.sum())
        n1 = conversations - n2
        x2 = int(resolved[arms].sum())
        x1 = int(resolved[~arms].sum())
        test = two_proportions(x1, n1, x2, n2)
        called += bool(test and test["p_value"] < ALPHA)
        sizes.append(n2 / conversations)
    return {"runs": runs, "called_significant": called, "rate": called / runs,
            "treatment_share_mean": float(np.mean(sizes)), "treatment_share_sd": float(np.std(sizes))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--per-arm", type=int, default=0, help="conversations per arm (default: 80%% power for +10)")
    ap.add_argument("--control", type=float, default=0.50)
    ap.add_argument("--lift", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=result_path("experiments_sim.json"))
    args = ap.parse_args()
    p1, p2 = args.control, args.control + args.lift
    per_arm = args.per_arm or required_per_arm(p1, p2, ALPHA, 0.8)
    rng = np.random.default_rng(args.seed)
    log(f"{args.runs} runs per scenario, {per_arm} conversations per arm ({2 * per_arm} in all)")
    ab = simulate(p1, p2, 2 * per_arm, args.runs, rng, first_id=1_000_000)
    aa = simulate(p1, p1, 2 * per_arm, args.runs, rng, first_id=2_000_000)
    se_ab = math.sqrt(ab["rate"] * (1 - ab["rate"]) / args.runs)
    se_aa = math.sqrt(aa["rate"] * (1 - aa["rate"]) / args.runs)
    rows = [(f"A/B +{round(100 * args.lift)} points: power", ab["rate"], se_ab,
             expected_power(p1, p2, per_arm, per_arm)),
            ("A/A: false alarms", aa["rate"], se_aa, ALPHA)]
    print(f"\n{'scenario':28} {'measured':>9} {'± 1 s.e.':>9} {'textbook':>9}")
    for name, rate, se, ref in rows:
        print(f"{name:28} {rate:9.3f} {se:9.3f} {ref:9.3f}")
    print(f"treatment share of conversations: {ab['treatment_share_mean']:.3f} (sd {ab['treatment_share_sd']:.3f}, "
          f"weight 0.5)")
    write_result(args.out, {"commit": git_commit(), "cpu": cpu_model(), "alpha": ALPHA, "control_rate": p1,
                            "treatment_rate": p2, "per_arm": per_arm, "runs": args.runs, "seed": args.seed,
                            "ab": {**ab, "se": se_ab, "textbook_power": expected_power(p1, p2, per_arm, per_arm)},
                            "aa": {**aa, "se": se_aa, "textbook_rate": ALPHA}})
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
