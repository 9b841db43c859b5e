"""The request fields that constrain the output (inference/structured/): OpenAI's `response_format`
and vLLM's `structured_outputs`, and how they become the engine's StructuredOutputsParams.

    "response_format": {"type": "json_object"}
    "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": {...}, "strict": true}}
    "structured_outputs": {"json": {...}} | {"regex": "..."} | {"choice": ["a", "b"]} | {"grammar": "root ::= ..."}
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from httpkit.validation import Errors, InvalidRequest
from inference.sampling_params import StructuredOutputsParams


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    error_messages: ClassVar[Errors] = Errors(extra_forbidden="{at}: unknown fields {unknown}",
                                              type="'{at}' must be of type {label}, got {got}")


class JsonSchemaFormat(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(_Strict):
    type: Annotated[Literal["text", "json_object", "json_schema"],
                    Errors("response_format.type: one of 'text', 'json_object', 'json_schema', got {input!r}")]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise InvalidRequest("response_format: 'json_schema' is required with type 'json_schema', and only "
                                 "then", "response_format")
        return self


class StructuredOutputsIn(_Strict):
    """vLLM's `structured_outputs` (exactly one field)."""
    json_: Annotated[dict[str, Any] | str | None, Field(alias="json")] = None
    json_object: bool | None = None
    regex: Annotated[str | None, Field(min_length=1)] = None
    choice: Annotated[list[Annotated[str, Field(min_length=1)]] | None, Field(min_length=1)] = None
    grammar: Annotated[str | None, Field(min_length=1)] = None
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


def structured_params(response_format: ResponseFormat | None,
                      structured: StructuredOutputsIn | None) -> StructuredOutputsParams | None:
    """The engine's constraint from the request, or None; InvalidRequest naming the field."""
    if response_format is not None and response_format.type != "text" and structured is not None:
        raise InvalidRequest("give either 'response_format' or 'structured_outputs', not both", "structured_outputs")
    try:
        if structured is not None:
            return StructuredOutputsParams(json=structured.json_, json_object=bool(structured.json_object),
                                           regex=structured.regex, choice=structured.choice,
                                           grammar=structured.grammar)
        if response_format is None or response_format.type == "text":
            return None
        if response_format.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        schema = response_format.json_schema.schema_
        return StructuredOutputsParams(json=schema) if schema is not None else StructuredOutputsParams(json_object=True)
    except ValueError as exc:
        raise InvalidRequest(str(exc), "structured_outputs" if structured is not None else "response_format") from None
