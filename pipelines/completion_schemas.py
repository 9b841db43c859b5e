"""The request bodies the code-completion pipeline accepts: Tabby's (`segments`) and OpenAI's legacy
completions body (`prompt`). pipelines/completion.py parses with them (`parse_tabby`,
`parse_openai`); the web app's /openapi.json documents them (app/schemas.py `CompletionIn`), so
the two cannot drift. The `Errors` markers keep the pipeline's messages ("segments.prefix:
required", "temperature: must be in [0.0, 2.0], got 3"), see httpkit/validation.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from httpkit.validation import Errors

MAX_SEED = 2**63 - 1 - 4              # SamplingParams seeds sample i with seed + i, and n <= 4 here
MAX_SEGMENT_CHARS = 200_000          # longer segments are cut before tokenising (then to the budget)


def _wrong_type(v: Mapping[str, Any]) -> str:
    if v["label"] == "str":
        return f"{v['at']}: must be a string, got {v['type']}"
    return f"{v['at']}: must be {'an integer' if v['label'] == 'int' else 'a number'}, got {v['input']!r}"


class _Body(BaseModel):
    """Strict JSON types; unknown fields are ignored (editors send more than we read)."""
    model_config = ConfigDict(extra="allow", strict=True)
    error_messages: ClassVar[Errors] = Errors(body="request body must be a JSON object", type=_wrong_type,
                                              range="{at}: must be in [{lo}, {hi}], got {input!r}")


Temperature = Annotated[float | None, Field(ge=0.0, le=2.0)]
Seed = Annotated[int | None, Field(ge=0, le=MAX_SEED)]


class Snippet(_Body):
    error_messages: ClassVar[Errors] = Errors()      # its list's marker says what a snippet must be
    filepath: Annotated[str | None, Errors("{at}: must be a string")] = None
    body: str


Snippets = Annotated[list[Snippet] | None,
                     Errors("{item}: must be an object with a string body",
                            list_type="{at}: must be a list of {{filepath, body}}, got {input!r}")]


class Segments(_Body):
    prefix: Annotated[str, Errors(lambda v: "segments.prefix: required" if v["input"] is None
                                  else _wrong_type(v), missing="segments.prefix: required")]
    declarations: Snippets = None
    relevant_snippets_from_changed_files: Snippets = None
    relevant_snippets_from_recently_opened_files: Snippets = None
    clipboard: str | None = None
    suffix: str | None = None
    filepath: Annotated[str | None, Errors(type="filepath: must be a string, got {type}")] = None
    git_url: str | None = None


class TabbyCompletionIn(_Body):
    model_config = ConfigDict(title="TabbyCompletionIn")
    segments: Annotated[Segments, Errors("segments: required, an object with at least a prefix")]
    language: str | None = None
    user: str | None = None
    temperature: Temperature = None
    seed: Seed = None


class OpenAICompletionIn(_Body):
    """OpenAI's legacy completions body: prompt = the text before the cursor (one prompt)."""
    model_config = ConfigDict(json_schema_extra={"not": {"required": ["segments"]}})
    prompt: Annotated[str | Annotated[list[str], Field(min_length=1, max_length=1)],
                      Errors("prompt: required, a string (one prompt per request)")]
    stop: Annotated[str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None,
                    Errors("stop: must be a non-empty string or a list of at most 4 non-empty strings")] = None
    stream: Annotated[bool, Errors("stream: must be true or false")] = False
    suffix: str | None = None
    language: str | None = None
    user: str | None = None
    filepath: str | None = None
    temperature: Temperature = None
    top_p: Annotated[float | None, Field(ge=1e-6, le=1.0)] = None
    max_tokens: Annotated[int | None, Field(ge=1, le=512)] = None
    n: Annotated[int | None, Field(ge=1, le=4)] = None
    seed: Seed = None
    repository: str | None = None


class ExtraChunk(_Body):
    error_messages: ClassVar[Errors] = Errors()
    filename: Annotated[str | None, Errors("{at}: must be a string")] = None
    text: str


class InfillIn(_Body):
    """llama.cpp's /infill body, as llama.vscode and llama.vim send it. Fields we do not use
    (t_max_prompt_ms, id_slot, lora, ...) are accepted and ignored. `cache_prompt: false` turns off
    the shifted KV reuse (its prompt is computed exactly; the exact prefix cache stays on)."""
    model_config = ConfigDict(title="InfillIn")
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[ExtraChunk] | None,
                           Errors("{item}: must be an object with a string text",
                                  list_type="{at}: must be a list of {{filename, text}}, got {input!r}")] = None
    prompt: Annotated[str, Errors("prompt: must be a string (the current line up to the cursor)")] = ""
    n_predict: Annotated[int | None, Field(ge=-1, le=512)] = None
    t_max_predict_ms: Annotated[int | None, Field(ge=0, le=600_000)] = None
    n_indent: Annotated[int | None, Field(ge=0, le=1000)] = None
    stop: Annotated[list[Annotated[str, Field(min_length=1)]] | None, Field(max_length=16),
                    Errors("stop: must be a list of at most 16 non-empty strings")] = None
    samplers: Annotated[list[str] | str | None, Errors("samplers: must be a list of sampler names or a string")] = None
    temperature: Temperature = None
    top_k: Annotated[int | None, Field(ge=-1, le=100_000)] = None
    top_p: Annotated[float | None, Field(ge=0.0, le=1.0)] = None
    seed: Annotated[int | None, Field(ge=-1, le=MAX_SEED)] = None
    stream: Annotated[bool, Errors("stream: must be true or false")] = False
    cache_prompt: Annotated[bool, Errors("cache_prompt: must be true or false")] = True
