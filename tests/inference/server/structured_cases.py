"""The JSON Schemas the structured-output tests hold the model to (30): nested objects, arrays with
min/max items, enums, consts, patterns, anyOf / nullable, integers and numbers with bounds,
$defs references. Strings and arrays are bounded so that every answer fits max_tokens."""
from __future__ import annotations


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


S = {"type": "string", "maxLength": 24}
INT = {"type": "integer", "minimum": 0, "maximum": 1000}

SCHEMAS = {
    "person": obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}}),
    "order_status": obj({"order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
                         "status": {"enum": ["pending", "shipped", "delivered", "returned"]}}),
    "tags": obj({"tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1,
                          "maxItems": 3}}),
    "nullable_note": obj({"note": {"anyOf": [S, {"type": "null"}]},
                          "score": {"type": "number", "minimum": 0, "maximum": 1}}),
    "nested": obj({"customer": obj({"email": {"type": "string", "maxLength": 40}, "vip": {"type": "boolean"}}),
                   "items": {"type": "array", "maxItems": 2,
                             "items": obj({"sku": {"type": "string", "maxLength": 8},
                                           "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    "boolean_flags": obj({"refund": {"type": "boolean"}, "escalate": {"type": "boolean"}}),
    "rating": obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": S}),
    "const_version": obj({"version": {"const": "v1"}, "ok": {"type": "boolean"}}),
    "enum_array": obj({"channels": {"type": "array", "items": {"enum": ["email", "chat", "phone"]},
                                    "minItems": 1, "maxItems": 3}}),
    "exact_items": obj({"pair": {"type": "array", "items": INT, "minItems": 2, "maxItems": 2}}),
    "price": obj({"amount": {"type": "number", "minimum": 0, "maximum": 10000}, "currency": {"enum": ["USD", "EUR",
                                                                                                     "GBP"]}}),
    "date_pattern": obj({"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}),
    "phone": obj({"phone": {"type": "string", "pattern": "^\\+[0-9]{7,12}$"}}),
    "optional_fields": obj({"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, required=["city"]),
    "nullable_int": obj({"count": {"type": ["integer", "null"], "minimum": 0, "maximum": 50}}),
    "any_of_types": obj({"value": {"anyOf": [INT, {"type": "boolean"}, S]}}),
    "deep": obj({"a": obj({"b": obj({"c": obj({"d": INT})})})}),
    "matrix": obj({"rows": {"type": "array", "maxItems": 2,
                            "items": {"type": "array", "items": INT, "minItems": 1, "maxItems": 2}}}),
    "address": obj({"street": S, "city": S, "country": {"enum": ["US", "CA", "GB", "DE", "FR"]},
                    "lines": {"type": "array", "items": S, "maxItems": 2}}),
    "ticket": obj({"priority": {"enum": ["low", "normal", "high", "urgent"]}, "subject": S,
                   "assignee": {"anyOf": [S, {"type": "null"}]}}),
    "refs": {"$defs": {"money": obj({"cents": INT, "currency": {"enum": ["USD", "EUR"]}})},
             **obj({"subtotal": {"$ref": "#/$defs/money"}, "total": {"$ref": "#/$defs/money"}})},
    "string_len": obj({"code": {"type": "string", "minLength": 3, "maxLength": 6}}),
    "int_range_negative": obj({"delta": {"type": "integer", "minimum": -10, "maximum": 10}}),
    "list_of_objects": obj({"contacts": {"type": "array", "minItems": 1, "maxItems": 2,
                                         "items": obj({"name": S, "role": {"enum": ["owner", "admin", "agent"]}})}}),
    "intent": obj({"intent": {"enum": ["order_status", "refund", "shipping", "other"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
    "sku_list": obj({"skus": {"type": "array", "items": {"type": "string", "pattern": "^SKU-[0-9]{3}$"},
                              "minItems": 1, "maxItems": 3}}),
    "empty_ok": obj({"notes": {"type": "array", "items": S, "maxItems": 2}}),
    "one_of_shapes": obj({"payment": {"anyOf": [obj({"card_last4": {"type": "string", "pattern": "^[0-9]{4}$"}}),
                                                obj({"iban_country": {"enum": ["DE", "FR", "NL"]}})]}}),
    "weekday": obj({"day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
                    "hour": {"type": "integer", "minimum": 0, "maximum": 23}}),
    "feedback": obj({"helpful": {"type": "boolean"}, "reason": {"anyOf": [{"enum": ["wrong", "slow", "rude"]},
                                                                          {"type": "null"}]}}),
}
