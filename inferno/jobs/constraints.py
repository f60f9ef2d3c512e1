"""The structured-output fields of a job line, as the server takes them: OpenAI's ``response_format``
(``text``, ``json_object``, ``json_schema``), vLLM's ``structured_outputs`` (``json``, ``regex``,
``choice``, ``grammar``, ``json_object``) and its older ``guided_json``, ``guided_regex``,
``guided_choice``, ``guided_grammar`` (honoured here, never ignored). One of them at most; what they ask
for becomes one `inferno.structured.Constraint`, and anything wrong with them (a shape, an invalid
schema, pattern or grammar, llguidance missing) is a `LineError` naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from inferno.errors import squash
from inferno.jobs.lines import LineError, describe

#: The line keys that ask for a constraint.
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
CONSTRAINT_KEYS = ("response_format", "structured_outputs", *GUIDED)
#: The keys of ``structured_outputs`` (one of them is given) and of ``response_format``'s json_schema.
STRUCTURED_OUTPUTS = ("json", "regex", "choice", "grammar", "json_object")
JSON_SCHEMA_KEYS = ("name", "description", "schema", "strict")


def pop_constraint(obj: dict[str, Any]) -> Any:
    """The `Constraint` that `obj`'s structured-output fields ask for (None: none does), those fields
    removed from `obj`; a `LineError` names the field that is wrong."""
    given = [key for key in CONSTRAINT_KEYS if obj.get(key) is not None
             and not (key == "response_format" and obj[key] == {"type": "text"})]
    if len(given) > 1:
        raise LineError(f"{given[0]} and {given[1]} both constrain the output: give one of them")
    values = {key: obj.pop(key) for key in CONSTRAINT_KEYS if key in obj}
    if not given:  # none, null, or response_format {"type": "text"}: plain text
        return None
    key = given[0]
    from inferno.structured import ConstraintError

    try:
        return _constraint(key, values[key])
    except ConstraintError as exc:
        raise LineError(constraint_message(exc)) from None


def constraint_message(exc: Any) -> str:
    """A `ConstraintError` as one line: the field, then the library's message (as the server says it)."""
    sep = " " if exc.reason.startswith(("is ", "must ", "has ", "needs ")) else ": "
    return squash(f"{exc.field}{sep}{exc.reason}")  # llguidance's messages may span lines


def _constraint(key: str, value: Any) -> Any:
    from inferno.structured import Constraint

    if key == "response_format":
        return _response_format(value)
    if key == "structured_outputs":
        if not isinstance(value, dict):
            raise LineError(f"structured_outputs must be an object with one of "
                            f"{', '.join(STRUCTURED_OUTPUTS)}, got {describe(value)}")
        inner = {k: v for k, v in value.items() if v is not None and v is not False}
        unknown = [k for k in inner if k not in STRUCTURED_OUTPUTS]
        if unknown:
            raise LineError(f"structured_outputs.{unknown[0]} is not supported (supported: "
                            f"{', '.join(STRUCTURED_OUTPUTS)})")
        if len(inner) != 1:
            what = "none" if not inner else " and ".join(inner)
            raise LineError(f"structured_outputs must give one of {', '.join(STRUCTURED_OUTPUTS)}, "
                            f"got {what}")
        [(kind, inner_value)] = inner.items()
        field = f"structured_outputs.{kind}"
        if kind == "json_object":
            if inner_value is not True:
                raise LineError(f"{field} must be true, got {describe(inner_value)}")
            return Constraint.json_object(field=field)
        return _kind(kind, inner_value, field)
    return _kind(key.removeprefix("guided_"), value, key)


def _kind(kind: str, value: Any, field: str) -> Any:
    """The constraint of a ``json``/``regex``/``choice``/``grammar`` value, its JSON type checked."""
    from inferno.structured import Constraint

    if kind == "json":
        if not isinstance(value, (dict, str, bool)):
            raise LineError(f"{field} must be a JSON Schema (an object, or its JSON text), "
                            f"got {describe(value)}")
        return Constraint.json_schema(value, field=field)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise LineError(f"{field} must be a non-empty list of strings, got {describe(value)}")
        return Constraint.choice(value, field=field)
    if not isinstance(value, str):
        raise LineError(f"{field} must be a string, got {describe(value)}")
    return Constraint.regex(value, field=field) if kind == "regex" else Constraint.grammar(value, field=field)


def _response_format(value: Any) -> Any:
    from inferno.structured import Constraint

    types = '"text", "json_object" or "json_schema"'
    if not isinstance(value, dict):
        raise LineError(f"response_format must be an object with a type ({types}), got {describe(value)}")
    kind = value.get("type")
    extra = [k for k in value if k not in ("type", "json_schema")]
    if extra or (kind != "json_schema" and "json_schema" in value):
        bad = extra[0] if extra else "json_schema"
        raise LineError(f"response_format.{bad} is not a field of a response_format of type "
                        f"{json.dumps(kind)}")
    if kind == "json_object":
        return Constraint.json_object(field="response_format")
    if kind != "json_schema":
        raise LineError(f"response_format.type must be {types}, got {describe(kind)}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise LineError('response_format.json_schema must be an object {"name", "schema", "strict"}, got '
                        f"{describe(spec)}")
    unknown = [k for k in spec if k not in JSON_SCHEMA_KEYS]
    if unknown:
        raise LineError(f"response_format.json_schema.{unknown[0]} is not a field (known: "
                        f"{', '.join(JSON_SCHEMA_KEYS)})")
    for key in ("name", "description"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise LineError(f"response_format.json_schema.{key} must be a string, got {describe(spec[key])}")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise LineError("response_format.json_schema.strict must be true or false, got "
                        f"{describe(spec['strict'])}")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise LineError("response_format.json_schema.schema must be a JSON Schema object, got "
                        f"{describe(schema)}")
    # strict false asks for best effort; the output is held to the schema either way.
    return Constraint.json_schema(schema, field="response_format.json_schema.schema")
