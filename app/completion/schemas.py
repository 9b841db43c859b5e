"""Request and response models of the code-completion API (app/completion/routes.py, app/completion/infill.py):
Tabby's and OpenAI's completion dialects, llama.cpp's /infill, events, health and repository
indexing. The request bodies themselves belong to the pipeline (pipelines/completion_schemas.py);
/openapi.json is generated from these (httpkit/openapi.py), as for app/schemas.py.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator

from app.schemas import _In
from httpkit.openapi import Stream
from httpkit.validation import Errors, InvalidRequest
from pipelines.completion_schemas import OpenAICompletionIn, TabbyCompletionIn


class CompletionIn(RootModel[TabbyCompletionIn | OpenAICompletionIn]):
    """Tabby's body (has `segments`) or OpenAI's legacy body (has `prompt`)."""


class TabbyChoice(BaseModel):
    index: int
    text: str


class TabbyCompletionOut(BaseModel):
    id: str
    choices: list[TabbyChoice]


class OpenAIChoice(BaseModel):
    text: str
    index: int
    logprobs: None = None
    finish_reason: str | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class OpenAICompletionOut(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[OpenAIChoice]
    usage: Usage


class CompletionOut(RootModel[TabbyCompletionOut | OpenAICompletionOut]):
    """In the dialect of the request."""


COMPLETION_STREAM = Stream({None: OpenAICompletionOut}, sentinel="[DONE]")


class EventIn(_In):
    type: Annotated[Literal["view", "select", "dismiss"], Errors("type: must be one of ['view', 'select', 'dismiss']")]
    completion_id: Annotated[str, Field(min_length=1), Errors("completion_id: required, a string")]
    select_kind: Annotated[Literal["line"] | None, Errors("select_kind: must be 'line' when given")] = None


class Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HealthOut(BaseModel):
    """What Tabby's editor plugins ask for on start."""
    model: str
    device: str
    arch: str
    cpu_info: str
    cpu_count: int | None
    cuda_devices: list[str]
    version: dict[str, str]


class InfillOut(BaseModel):
    """llama.cpp's /infill answer (the fields llama.vscode and llama.vim read, and more)."""
    model_config = ConfigDict(extra="allow")
    content: str
    stop: bool
    stop_type: str
    tokens_predicted: int
    tokens_evaluated: int
    tokens_cached: int                 # of tokens_evaluated, served from the prefix cache
    truncated: bool
    generation_settings: dict[str, Any]
    timings: dict[str, float]


class InfillChunk(BaseModel):
    """One event of a streamed /infill: text, then a last one with stop: true and the rest of InfillOut."""
    model_config = ConfigDict(extra="allow")
    content: str
    stop: bool


INFILL_STREAM = Stream({None: InfillChunk})


class ServerSettingOut(BaseModel):
    """Tabby's client-side settings."""
    disable_client_side_telemetry: bool


class RepositoryIn(_In):
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=r"\S",
                               description="the repository's name or git_url"),
                    Errors("name: required, a string (the repository's name or git_url)")]
    path: Annotated[str, Field(min_length=1, pattern=r"^[^\x00]+$",
                               description="a folder on the server under COMPLETION_REPO_ROOTS"),
                    Errors("path: required, a folder on the server (no NUL characters)")]

    @field_validator("name")
    @classmethod
    def _not_blank(cls, name: str) -> str:
        if not name.strip():                   # Python's whitespace, wider than the pattern's
            raise InvalidRequest("name: required, a string (the repository's name or git_url)")
        return name


class RepositoryJob(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["queued", "running", "done", "failed"]
    name: str | None = None
    num_chunks: int | None = None
    error: str | None = None
