"""OpenAPI 3.1 documents derived from a Flask app: the paths, methods and path parameters come from
its URL map, every schema from the pydantic models its views declare with `@documented`.

    @bp.post("/sessions/<sid>/messages")
    @documented(body=MessageIn, responses={200: [ChatReplyOut, SSE], 404: Error}, path=SessionPath)
    def post_message(sid): ...

    app.get("/openapi.json")(lambda: build_spec(app, title=..., version=...))

Nothing in the document is written by hand: change a model or a route and the spec follows. A view
without `@documented` is left out (the HTML demo, /kb/ articles); tests check that every JSON route
of each API is documented.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

if TYPE_CHECKING:
    from flask import Flask

_ATTR = "__openapi__"
_RULE_ARG = re.compile(r"<(?:[a-z_]+:)?([A-Za-z_][A-Za-z0-9_]*)>")


@dataclass(frozen=True)
class Body:
    """A non-model payload: `schema` is a plain JSON schema (an SSE stream, a JSONL file, metrics text)."""
    media_type: str
    schema: dict = field(default_factory=lambda: {"type": "string"})
    description: str = ""


@dataclass(frozen=True)
class Stream:
    """A server-sent-event stream: `events` maps an event name (None: unnamed) to the pydantic model
    of its JSON `data`; `sentinel` is a literal final data line (OpenAI's "[DONE]")."""
    events: dict[str | None, type[BaseModel] | tuple[type[BaseModel], ...]]
    sentinel: str | None = None
    media_type: str = "text/event-stream"


@dataclass(frozen=True)
class Doc:
    summary: str
    body: type[BaseModel] | None
    extra_bodies: tuple[Body, ...]          # other accepted request media types (JSONL for batch jobs)
    body_required: bool
    responses: dict[int, tuple]             # status -> (model or Body, ...)
    path: type[BaseModel] | None            # the path parameters' model
    headers: type[BaseModel] | None         # request headers the operation reads (not auth)
    security: tuple[str, ...] | None        # names of the spec's security schemes; None = the API's default
    tags: tuple[str, ...]
    query: type[BaseModel] | None = None    # the query string's parameters


def documented(*, responses: dict[int, Any], body: type[BaseModel] | None = None, body_required: bool = True,
               extra_bodies: tuple[Body, ...] = (), path: type[BaseModel] | None = None,
               headers: type[BaseModel] | None = None, security: tuple[str, ...] | None = None,
               tags: tuple[str, ...] = (), summary: str | None = None, query: type[BaseModel] | None = None):
    """Attach the operation's contract to a view function (apply below the route decorator)."""
    def mark(view):
        norm = {int(s): tuple(v) if isinstance(v, (list, tuple)) else (v,) for s, v in responses.items()}
        doc = (view.__doc__ or view.__name__).strip().splitlines()[0]
        setattr(view, _ATTR, Doc(summary or doc, body, tuple(extra_bodies), body_required, norm, path, headers,
                                 security, tuple(tags), query))
        return view
    return mark


def doc_of(view) -> Doc | None:
    return getattr(view, _ATTR, None)


def _models(docs: list[Doc]) -> list[type[BaseModel]]:
    seen: dict[type, None] = {}
    for d in docs:
        for m in (d.body, *(x for v in d.responses.values() for x in v)):
            for model in (_flat(m.events.values()) if isinstance(m, Stream) else (m,)):
                if isinstance(model, type) and issubclass(model, BaseModel):
                    seen[model] = None
    return list(seen)


def _flat(items) -> list:
    return [m for item in items for m in (item if isinstance(item, tuple) else (item,))]


def _event_schema(stream: Stream, refs: dict[type, dict]) -> dict:
    """One event of the stream (OpenAPI 3.1: a text/event-stream schema describes each event)."""
    options = []
    for name, models in stream.events.items():
        models = _flat([models])
        data = refs[models[0]] if len(models) == 1 else {"anyOf": [refs[m] for m in models]}
        event = {"type": "object", "required": ["data"],
                 "properties": {"data": {"type": "string", "contentMediaType": "application/json",
                                         "contentSchema": data}}}
        if name is not None:
            event["required"] = ["event", "data"]
            event["properties"]["event"] = {"const": name}
        options.append(event)
    if stream.sentinel is not None:
        options.append({"type": "object", "required": ["data"], "properties": {"data": {"const": stream.sentinel}}})
    return options[0] if len(options) == 1 else {"anyOf": options}


def _params(model: type[BaseModel] | None, where: str, components: dict) -> list[dict]:
    if model is None:
        return []
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(schema.pop("$defs", {}))
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema["properties"].items():          # keyed by alias: the name on the wire
        desc = prop.pop("description", None)
        prop.pop("default", None)
        prop.pop("title", None)
        param = {"name": name, "in": where, "required": where == "path" or name in required, "schema": prop}
        if desc:
            param["description"] = desc
        out.append(param)
    return out


def _content(items: tuple, refs: dict[type, dict]) -> dict:
    content = {}
    for item in items:
        if isinstance(item, Body):
            content[item.media_type] = {"schema": item.schema}
        elif isinstance(item, Stream):
            content[item.media_type] = {"schema": _event_schema(item, refs)}
        else:
            content["application/json"] = {"schema": refs[item]}
    return content


def build_spec(app: Flask, *, title: str, version: str, description: str = "",
               security_schemes: dict[str, dict] | None = None,
               default_security: dict[str, tuple[str, ...]] | None = None, prefix: str = "") -> dict:
    """The OpenAPI 3.1 document of every documented route of `app` whose path starts with `prefix`.

    `default_security` maps a path prefix to the security schemes its operations need unless a view
    says otherwise (e.g. {"/api/chat/": ("siteKey",)})."""
    ops: list[tuple[str, str, Doc]] = []
    for rule in app.url_map.iter_rules():
        doc = doc_of(app.view_functions.get(rule.endpoint))
        if doc is None or not rule.rule.startswith(prefix):
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            ops.append((rule.rule, method.lower(), doc))
    _, top = models_json_schema([(m, "validation") for m in _models([d for _, _, d in ops])],
                                ref_template="#/components/schemas/{model}")
    components: dict[str, Any] = dict(top.get("$defs", {}))
    refs = {m: {"$ref": f"#/components/schemas/{m.__name__}"} for m in _models([d for _, _, d in ops])}
    paths: dict[str, dict] = {}
    for rule, method, doc in sorted(ops):
        path = _RULE_ARG.sub(r"{\1}", rule)
        op: dict[str, Any] = {"operationId":
                              f"{method}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
                              "summary": doc.summary,
                              "responses": {str(s): {"description": _reason(s), "content": _content(v, refs)}
                                            for s, v in sorted(doc.responses.items())}}
        if doc.tags:
            op["tags"] = list(doc.tags)
        params = (_params(doc.path, "path", components) + _params(doc.query, "query", components)
                  + _params(doc.headers, "header", components))
        declared = {p["name"] for p in params if p["in"] == "path"}
        params += [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                   for n in _RULE_ARG.findall(rule) if n not in declared]
        if params:
            op["parameters"] = params
        if doc.body is not None or doc.extra_bodies:
            items = ((doc.body,) if doc.body is not None else ()) + doc.extra_bodies
            op["requestBody"] = {"required": doc.body_required, "content": _content(items, refs)}
        security = doc.security
        if security is None:
            security = next((s for p, s in (default_security or {}).items() if rule.startswith(p)), ())
        if security:
            op["security"] = [{name: []} for name in security]
        paths.setdefault(path, {})[method] = op
    spec: dict[str, Any] = {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths,
                            "components": {"schemas": components}}
    if description:
        spec["info"]["description"] = description
    if security_schemes:
        spec["components"]["securitySchemes"] = security_schemes
    return spec


def _reason(status: int) -> str:
    from http import HTTPStatus
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return str(status)
