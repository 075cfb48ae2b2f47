"""A JSON Schema check for the subset the suite uses (tool parameters, structured output): no dependency.

Supported keywords: type (one or a list), properties, required, additionalProperties (a boolean), enum, const,
items (one schema), minItems, maxItems, minimum, maximum, minLength, maxLength, pattern; description and title
are ignored. A schema with any other keyword is refused when the suite loads (`unsupported`), so nothing is
passed unchecked."""

from __future__ import annotations

import re
from typing import Any

KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems",
                      "maxItems", "minimum", "maximum", "minLength", "maxLength", "pattern", "description", "title"})
TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})


def unsupported(schema: Any, where: str = "$") -> str | None:
    """Why `schema` is outside the supported subset (None when it is inside), naming where."""
    if not isinstance(schema, dict):
        return f"{where} is not a table"
    for key in schema:
        if key not in KEYWORDS:
            return f"{where} uses {key!r}, which sparkfleet's schema check does not know (it knows {sorted(KEYWORDS)})"
    types = schema.get("type")
    for t in types if isinstance(types, list) else [types] if types is not None else []:
        if t not in TYPES:
            return f"{where} has type {t!r} (one of {sorted(TYPES)})"
    if "pattern" in schema:
        try:
            re.compile(str(schema["pattern"]))
        except re.error as e:
            return f"{where} has a pattern that does not compile ({e})"
    if "additionalProperties" in schema and not isinstance(schema["additionalProperties"], bool):
        return f"{where} has an additionalProperties that is not true or false"
    if "required" in schema and not (isinstance(schema["required"], list)
                                     and all(isinstance(r, str) for r in schema["required"])):
        return f"{where} has a required that is not a list of names"
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return f"{where}.properties is not a table"
    for name, sub in properties.items():
        if why := unsupported(sub, f"{where}.{name}"):
            return why
    if "items" in schema:
        return unsupported(schema["items"], f"{where}[]")
    return None


def _is_type(value: Any, t: str) -> bool:
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return type(value) is {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}[t]


def problem(value: Any, schema: dict, where: str = "$") -> str | None:
    """The first way `value` breaks `schema` (a supported one), or None when it conforms."""
    types = schema.get("type")
    if types is not None:
        wanted = types if isinstance(types, list) else [types]
        if not any(_is_type(value, t) for t in wanted):
            return f"{where} is {type(value).__name__}, not {'/'.join(wanted)}"
    if "const" in schema and value != schema["const"]:
        return f"{where} is not {schema['const']!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} is not one of {schema['enum']!r}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            return f"{where} has a length out of bounds"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return f"{where} does not match {schema['pattern']!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} is below {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} is above {schema['maximum']}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            return f"{where} has a number of items out of bounds"
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                if why := problem(item, schema["items"], f"{where}[{i}]"):
                    return why
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                return f"{where} lacks {name!r}"
        for name, item in value.items():
            if name in properties:
                if why := problem(item, properties[name], f"{where}.{name}"):
                    return why
            elif schema.get("additionalProperties") is False:
                return f"{where} has {name!r}, which the schema does not allow"
    return None
