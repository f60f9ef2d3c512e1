"""A generation request's constraint (structured output): its fields read into one `Constraint`.

A request may ask for one constraint, in any of the spellings the field's servers use:

* OpenAI's ``response_format``: ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema":
  {"name": ..., "schema": {...}, "strict": ...}}`` (``{"type": "text"}`` asks for none);
* vLLM's ``structured_outputs``: exactly one of ``json`` (a schema, or its JSON text), ``regex``,
  ``choice``, ``grammar`` (Lark) and ``json_object``;
* vLLM's older names ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``, which
  vLLM has since dropped and silently ignores: here they are honoured, as their new spellings are.

Two of them in one request is a 400 naming both. A schema, regular expression or grammar that the
constraint library refuses is a 400 whose ``param`` names the field and whose message is the library's;
without the library installed, a 400 that says how to install it. The constraint is compiled for the
model's tokenizer in a worker thread before the request reaches the engine (`RequestConstraint.compile`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferno.serve.errors import ApiError
from inferno.serve.schemas import GenerationRequest
from inferno.structured import Constraint, ConstraintError
from inferno.tokenizer import Tokenizer

#: The fields of ``structured_outputs``, as the client spells them.
STRUCTURED_FIELDS = ("json", "regex", "choice", "grammar", "json_object")

#: How each kind of value becomes a Constraint whose errors name `field`.
_BUILD: dict[str, Callable[[Any, str], Constraint]] = {
    "json": lambda value, field: Constraint.json_schema(value, field=field),
    "json_object": lambda value, field: Constraint.json_object(field=field),
    "regex": lambda value, field: Constraint.regex(value, field=field),
    "choice": lambda value, field: Constraint.choice(value, field=field),
    "grammar": lambda value, field: Constraint.grammar(value, field=field),
}

# What a request asks for: (the field as the client names it, the kind, its value)
_Asked = tuple[str, str, Any]


def _response_format(req: GenerationRequest) -> list[_Asked]:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        return [("response_format", "json_object", None)]
    return [("response_format.json_schema.schema", "json", fmt.json_schema.schema_)]


def _structured_outputs(req: GenerationRequest) -> list[_Asked]:
    so = req.structured_outputs
    if so is None:
        return []
    values = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
              "json_object": so.json_object or None}  # false asks for nothing
    given = [(f"structured_outputs.{k}", k, values[k]) for k in STRUCTURED_FIELDS if values[k] is not None]
    if not given:
        raise ApiError(400, f"structured_outputs needs one of {', '.join(STRUCTURED_FIELDS)}",
                       param="structured_outputs")
    return given


def _guided(req: GenerationRequest) -> list[_Asked]:
    values = {"json": req.guided_json, "regex": req.guided_regex, "choice": req.guided_choice,
              "grammar": req.guided_grammar}
    return [(f"guided_{k}", k, v) for k, v in values.items() if v is not None]


@dataclass(frozen=True)
class RequestConstraint:
    """The constraint a request asks for, and the field that asked for it (as the client names it)."""

    constraint: Constraint
    field: str

    def compile(self, tokenizer: Tokenizer) -> None:
        """Compile it for `tokenizer` now (cached per tokenizer), so that the engine's submit, on the event
        loop, finds it compiled: a large schema takes a while. Run in a worker thread."""
        try:
            self.constraint.start(tokenizer)
        except ConstraintError as exc:
            raise ApiError(400, f"{self.field}: {exc.reason}", param=self.field) from None


def request_constraint(req: GenerationRequest) -> RequestConstraint | None:
    """The constraint `req` asks for (None: none); an `ApiError` (400) names the field at fault."""
    asked = _response_format(req) + _structured_outputs(req) + _guided(req)
    if not asked:
        return None
    if len(asked) > 1:
        a, b = asked[0][0], asked[1][0]
        raise ApiError(400, f"{a} and {b} each ask for a constraint on the output; send only one of them",
                       param=b)
    field, kind, value = asked[0]
    try:
        return RequestConstraint(_BUILD[kind](value, field), field)
    except ConstraintError as exc:
        reason = exc.reason
        sep = " " if reason.startswith(("is ", "must ", "has ", "needs ")) else ": "
        raise ApiError(400, f"{exc.field}{sep}{reason}", param=exc.field) from None
