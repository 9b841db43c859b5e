"""httpkit/validation.py: one pydantic model parses a body, and the first problem comes back as
InvalidRequest with our words and the field it is about (`param`), however deep or unusual."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, field_validator

from httpkit.errors import OpenAIError, validate_request
from httpkit.validation import Errors, InvalidRequest, validate


class Part(BaseModel):
    model_config = ConfigDict(strict=True)
    error_messages: ClassVar[Errors] = Errors()
    kind: Literal["text"]
    text: str


class Turn(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    error_messages: ClassVar[Errors] = Errors(object="'{at}' must be an object")
    role: Annotated[Literal["user", "assistant"], Errors("'{at}' must be user or assistant, got {input!r}")]
    content: Annotated[str | list[Part],
                       Errors("'{at}' parts must be text parts", string_type="'{at}' must be a string")]


class Options(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    error_messages: ClassVar[Errors] = Errors(type="'{at}' must be of type {label}, got {got}")
    verbose: bool | None = None


class Req(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    error_messages: ClassVar[Errors] = Errors(body="request body must be a JSON object",
                                              extra_forbidden="unknown: {unknown_names}",
                                              finite_number="'{at}' must be a finite number",
                                              type="'{at}' must be of type {label}, got {got}")
    count: Annotated[int | None, Field(ge=1, le=16),
                     Errors(range="count: must be in [{lo}, {hi}], got {input!r}")] = None
    ratio: float | None = None
    options: Annotated[Options | None,
                       Errors(extra_forbidden=lambda v: f"unknown options: {sorted(v['value'])}")] = None
    turns: Annotated[list[Turn], Field(min_length=1), Errors("'turns' must be a non-empty list")] = [Turn(role="user",
                                                                                                           content="x")]
    key: Annotated[str | None, Field(alias="X-Key", min_length=2), Errors("X-Key: at least 2 characters")] = None
    name: str | None = None

    @field_validator("name")
    @classmethod
    def _no_admin(cls, name):
        if name == "admin":
            raise InvalidRequest("name: reserved", status=403)
        if name == "root":
            raise ValueError("name: root is reserved too")
        return name


def problem(body) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate(Req, body)
    return info.value


@pytest.mark.parametrize("body, message, param", [
    ([1], "request body must be a JSON object", None),
    ({"count": "3"}, "'count' must be of type int, got str", "count"),            # strict: no "3" for 3
    ({"count": True}, "'count' must be of type int, got a boolean", "count"),
    ({"count": 2.0}, "'count' must be of type int, got float", "count"),
    ({"count": 0}, "count: must be in [1, 16], got 0", "count"),                   # boundaries: 1 and 16 pass
    ({"count": 17}, "count: must be in [1, 16], got 17", "count"),
    ({"ratio": float("nan")}, "'ratio' must be a finite number", "ratio"),
    ({"ratio": "x"}, "'ratio' must be of type int/float, got str", "ratio"),
    ({"options": {"verbose": "yes"}}, "'options.verbose' must be of type bool, got str", "options"),
    ({"options": {"loud": 1, "verbose": True}}, "unknown options: ['loud', 'verbose']", "options"),
    ({"options": []}, "'options' must be of type dict, got list", "options"),
    ({"turns": []}, "'turns' must be a non-empty list", "turns"),
    ({"turns": [5]}, "'turns[0]' must be an object", "turns"),
    ({"turns": [{"role": "bot", "content": "x"}]}, "'turns[0].role' must be user or assistant, got 'bot'", "turns"),
    ({"turns": [{"role": "user", "content": 5}]}, "'turns[0].content' must be a string", "turns"),
    # a union's member that came closest speaks: the list of parts, not "must be a string"
    ({"turns": [{"role": "user", "content": [{"kind": "image", "text": "x"}]}]},
     "'turns[0].content' parts must be text parts",
     "turns"),
    ({"turns": [{"role": "user", "content": [{"kind": "text", "text": 1}]}]},
     "'turns[0].content' parts must be text parts",
     "turns"),
    ({"X-Key": "a"}, "X-Key: at least 2 characters", "X-Key"),                      # by its alias, the wire name
    ({"name": "root"}, "name: root is reserved too", "name"),                      # a validator's ValueError text
])
def test_the_first_problem_in_our_words_naming_the_field(body, message, param):
    err = problem(body)
    assert (str(err), err.param, err.status) == (message, param, 400)


def test_unknown_fields_come_first_all_of_them_sorted():
    err = problem({"zeta": 1, "alpha": 2, "count": "bad"})
    assert (err.message, err.param) == ("unknown: alpha, zeta", "alpha")


def test_a_validator_sets_status_and_the_field_is_filled_in():
    err = problem({"name": "admin"})
    assert (err.message, err.param, err.status) == ("name: reserved", "name", 403)


def test_valid_bodies_parse_and_unknown_fields_inside_allowed_models_stay():
    req = validate(Req, {"count": 16, "ratio": 1, "turns": [{"role": "user", "content": "x", "name": "n"}]})
    assert req.count == 16 and req.ratio == 1.0 and req.turns[0].model_extra == {"name": "n"}


def test_invalid_request_is_a_value_error_and_openai_error_carries_it():
    assert issubclass(InvalidRequest, ValueError)
    with pytest.raises(OpenAIError) as info:
        validate_request(Req, {"count": 99})
    assert info.value.body() == {"error": {"message": "count: must be in [1, 16], got 99",
                                           "type": "invalid_request_error", "param": "count", "code": None}}
    assert info.value.status == 400


def test_a_lone_surrogate_in_a_constrained_text_field_is_named():
    class Text(BaseModel):                     # (pydantic checks a length or pattern on UTF-8 text)
        model_config = ConfigDict(strict=True)
        body: Annotated[str, Field(min_length=1), Errors("body: must be a non-empty string")]
        choice: Annotated[Literal["a"], Errors("choice: must be 'a'")] = "a"
    with pytest.raises(InvalidRequest, match=r"^body: contains an unpaired surrogate \(\\ud800-\\udfff\)$"):
        validate(Text, {"body": "a\ud800"})
    with pytest.raises(InvalidRequest, match=r"^choice: must be 'a'$"):      # not a text field: its own words
        validate(Text, {"body": "b", "choice": "\ud800"})


def test_without_a_marker_pydantic_says_it_with_the_location():
    class Bare(BaseModel):
        items: list[int]
    with pytest.raises(InvalidRequest) as info:
        validate(Bare, {"items": [1, "x"]})
    assert info.value.param == "items" and str(info.value).startswith("items[1]: ")


class Loose(BaseModel):
    mode: Annotated[Literal["a", "b"], Errors("'mode' must be 'a' or {'kind': 'b'}")] = "a"   # an unescaped brace


def test_a_broken_error_template_still_gives_a_400_naming_the_field():
    with pytest.raises(InvalidRequest) as err:
        validate(Loose, {"mode": "c"})
    assert err.value.param == "mode" and err.value.status == 400 and "mode" in str(err.value)
