"""The support chat's answers on the help-centre evaluation set, end to end: the real app on its
default model, in the default (extractive) answer mode, driven by bench/cpu/answers.py. Every
second question of bench/data/answers_eval.yaml (79 of 158: plain, paraphrased, follow-up,
Chinese and unanswerable ones).

It guards the whole turn, not one stage: when support-chat actions started taking questions that
mention "my order" (stop 55), each unit test still passed, and accuracy fell from 90% to 78%."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.harness import ROOT


@pytest.mark.slow
def test_help_centre_questions_get_the_facts_and_nothing_invented(tmp_path):
    out = tmp_path / "answers.json"
    proc = subprocess.run([sys.executable, "-m", "bench.cpu.answers", "--answer-mode", "extractive", "--every", "2",
                           "--label", "suite", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(out.read_text())["runs"]["suite:answers_eval:every2"]
    wrong = [(i["id"], i["reply"][:120]) for i in run["items"] if i["kind"] != "unanswerable" and not i["correct"]]
    assert run["accuracy"] >= ACCURACY, wrong
    assert run["hallucination_rate"] == 0 and run["leaked_instruction_replies"] == 0
    assert run["unanswerable_handled"] >= 0.8
    assert not any("starts with NW-" in i["reply"] for i in run["items"]), "a question got an action's question"


ACCURACY = 0.85
