"""Request and response models of the A/B experiments API (app/agent/experiments_api.py)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from app.agent.schemas import _AgentIn
from app.store.models import EXPERIMENT_FACTORS
from httpkit.validation import Errors, InvalidRequest
from pipelines.grounded_answer import ANSWER_MODES


class ArmIn(_AgentIn):
    name: Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,32}$"),
                    Errors("arms[].name: 1-32 characters of a-z, 0-9, _ and -")]
    weight: Annotated[float, Field(gt=0, le=1), Errors("arms[].weight: a number above 0 and at most 1")]
    value: Annotated[str, Field(min_length=1, max_length=4000, pattern=r"\S"),
                     Errors("arms[].value: a non-empty string of at most 4,000 characters")]


class ExperimentIn(_AgentIn):
    name: Annotated[str, Field(min_length=1, max_length=80, pattern=r"\S"),
                    Errors("name: a non-empty string of at most 80 characters")]
    factor: Annotated[Literal[EXPERIMENT_FACTORS],
                      Errors("factor: must be answer_mode, system_prompt or max_tokens (one model is served here)")]
    arms: Annotated[list[ArmIn], Field(min_length=2, max_length=4),
                    Errors("arms: 2 to 4 arms, each {name, weight, value}; the first is the control")]

    @model_validator(mode="after")
    def _arms(self):
        total = sum(a.weight for a in self.arms)
        if abs(total - 1.0) > 1e-6:
            raise InvalidRequest(f"arms: the weights must sum to 1; they sum to {total:g}")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise InvalidRequest("arms: each arm needs its own name")
        for i, a in enumerate(self.arms):
            if self.factor == "answer_mode" and a.value not in ANSWER_MODES:
                raise InvalidRequest(f"arms[{i}].value: unknown answer mode {a.value!r}; one of "
                                     f"{', '.join(ANSWER_MODES)}")
            if self.factor == "max_tokens" and not (a.value.isdigit() and 8 <= int(a.value) <= 2048):
                raise InvalidRequest(f"arms[{i}].value: a reply's token budget, a whole number from 8 to 2048")
        return self


class ExperimentPath(BaseModel):
    experiment_id: int = Field(description="the experiment's id")


class ArmVersus(BaseModel):
    resolution: dict | None = Field(description="{difference, ci_low, ci_high, p_value} of the resolution rate "
                                    "against the control (two-proportion z-test)")
    handoff: dict | None = Field(description="the same for the handoff rate")
    resolution_significant: bool
    handoff_significant: bool


class ArmResult(BaseModel):
    arm: str
    value: str
    weight: float
    conversations: int
    decided: int
    undecided: int
    resolution_rate: float | None
    resolution_ci: list[float] | None = Field(description="95% Wilson interval")
    handoffs: int
    handoff_rate: float | None
    handoff_ci: list[float] | None
    csat_average: float | None
    csat_count: int
    first_text_p50_ms: float | None
    vs_control: ArmVersus | None


class ExperimentOut(BaseModel):
    id: int
    name: str
    factor: str
    arms: list[dict]
    status: Literal["running", "stopped"]
    started_at: str | None
    stopped_at: str | None
    results: list[ArmResult] | None = None


class ExperimentList(BaseModel):
    experiments: list[ExperimentOut]
