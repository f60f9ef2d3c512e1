"""Structured output: a constraint on what a generation may produce, enforced token by token.

A `Constraint` is what a request asks for, as plain data (hashable, the same for every model):

* ``Constraint.json_schema(schema)``: JSON that validates against a JSON Schema (a dict, its JSON text, or
  a Pydantic model class);
* ``Constraint.json_object()``: any JSON object (OpenAI's ``{"type": "json_object"}``);
* ``Constraint.regex(pattern)``: text that the regular expression matches in full;
* ``Constraint.choice([...])``: exactly one of the given strings;
* ``Constraint.grammar(lark)``: text of a context-free grammar in Lark's notation (``start:`` its start).

Each is checked when it is made: a schema, pattern or grammar that the constraint library refuses is a
`ConstraintError` naming the field and carrying the library's own message.

The library is llguidance (``pip install 'inferno-gpt2[structured]'``), imported only when a constraint is
made or used. It sees inferno's own tokenizer (`lltokenizer`: every id's bytes, the EOS ids, which ids are
special), so it works for every tokenizer inferno loads. `ConstraintMatcher` is one sequence's state:
which ids may come next (the "mask"), fed the ids chosen; `inferno.options.SequenceState` applies it on
the host logits of each step, so batch-1 generation and the engine behave alike. Compiled constraints
are cached per (constraint, tokenizer): the grammar is built once and each sequence starts from a copy.

JSON is written the way ``json.dumps`` writes it by default (``", "`` and ``": "`` between items, no other
whitespace), so a model cannot spend its tokens on whitespace; a schema may say otherwise with
llguidance's ``"x-guidance"`` key (e.g. ``{"whitespace_flexible": true}``). The properties of an object
come in the order the schema lists them.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from inferno.options import OptionError
from inferno.tokenizer import Tokenizer

if TYPE_CHECKING:  # llguidance is an optional extra: imported where used, never at import time
    import llguidance

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
INSTALL_HINT = "needs llguidance: pip install 'inferno-gpt2[structured]'"

#: How JSON is written (see the module docstring); a schema's "x-guidance" key overrides these.
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

#: Compiled constraints kept per tokenizer (the least recently used go first).
CACHE_SIZE = 64


class ConstraintError(OptionError):
    """A constraint that cannot be used: `field` names the request field, `reason` says why (for a bad
    schema, pattern or grammar, the constraint library's own message)."""


class ConstraintFailure(RuntimeError):
    """The constraint library refused a step it had allowed (a bug, here or there), with its message."""


def _llguidance(field: str):
    try:
        import llguidance
    except ImportError:
        raise ConstraintError(field, INSTALL_HINT) from None
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """What the output must be: `kind` (one of `KINDS`) and `source`, its canonical text: the schema as
    compact JSON (its keys in the order given: that order is the order of the output's properties), the
    pattern, the choices as a JSON list, the grammar. Make one with the class methods, which check it."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError("constraint", f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise ConstraintError("constraint", f"source must be a string, got {type(self.source).__name__}")

    # ---------------------------------------------------------------------------------- the four kinds
    @classmethod
    def json_schema(cls, schema: Any, *, field: str = "json_schema") -> Constraint:
        """JSON valid against `schema`: a dict, its JSON text, or a Pydantic model class (anything with
        ``model_json_schema()``)."""
        if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
            try:
                schema = schema.model_json_schema()
            except Exception as exc:  # noqa: BLE001 - Pydantic's own error, passed on
                raise ConstraintError(field, f"is a model class whose JSON Schema cannot be made: {exc}") \
                    from None
        if isinstance(schema, (str, bytes, bytearray)):
            try:
                schema = json.loads(schema)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ConstraintError(field, f"is not valid JSON: {exc}") from None
        if not isinstance(schema, Mapping):
            raise ConstraintError(field, f"must be a JSON Schema (a JSON object), got "
                                         f"{type(schema).__name__}")
        try:
            source = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConstraintError(field, f"is not JSON data: {exc}") from None
        return cls._checked("json_schema", source, field)

    @classmethod
    def json_object(cls, *, field: str = "response_format") -> Constraint:
        """Any JSON object."""
        return cls._checked("json_object", '{"type":"object"}', field)

    @classmethod
    def regex(cls, pattern: str, *, field: str = "regex") -> Constraint:
        """Text that `pattern` matches in full (Rust's regex syntax, close to Python's ``re`` without
        lookaround or backreferences)."""
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError(field, f"must be a non-empty string, got {_short(pattern)}")
        return cls._checked("regex", pattern, field)

    @classmethod
    def choice(cls, options: Sequence[str], *, field: str = "choice") -> Constraint:
        """Exactly one of `options` (non-empty strings; duplicates are dropped)."""
        if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
            raise ConstraintError(field, f"must be a list of strings, got {_short(options)}")
        if not options:
            raise ConstraintError(field, "must hold at least one string")
        for o in options:
            if not isinstance(o, str) or not o:
                raise ConstraintError(field, f"must hold non-empty strings, got {_short(o)}")
        source = json.dumps(list(dict.fromkeys(options)), ensure_ascii=False)
        return cls._checked("choice", source, field)

    @classmethod
    def grammar(cls, lark: str, *, field: str = "grammar") -> Constraint:
        """Text of the Lark grammar `lark` (its rule ``start``; llguidance's dialect: lexer rules in
        capitals, ``%ignore``, regular expressions between slashes)."""
        if not isinstance(lark, str) or not lark.strip():
            raise ConstraintError(field, f"must be a non-empty string (a Lark grammar), got {_short(lark)}")
        return cls._checked("grammar", lark, field)

    @classmethod
    def _checked(cls, kind: str, source: str, field: str) -> Constraint:
        constraint = cls(kind, source)
        llg = _llguidance(field)
        try:
            grammar = _grammar(constraint)
        except ValueError as exc:
            raise ConstraintError(field, str(exc).strip()) from None
        error = llg.LLMatcher.validate_grammar(grammar)
        if error:
            raise ConstraintError(field, error.strip())
        return constraint

    # ------------------------------------------------------------------------------------------- use
    def start(self, tokenizer: Tokenizer) -> ConstraintMatcher:
        """A fresh matcher for one sequence generated with `tokenizer` (compiled once per tokenizer)."""
        return ConstraintMatcher(_compiled(self, tokenizer).deep_copy(), tokenizer.vocab_size)

    def describe(self) -> str:
        """One line for logs and error messages."""
        text = self.source if len(self.source) <= 60 else self.source[:57] + "..."
        return f"{self.kind} {text}"


def response_format(value: Any, *, field: str = "response_format") -> Constraint | None:
    """OpenAI's ``response_format`` as a constraint: ``{"type": "text"}`` (None: no constraint),
    ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"schema": {...}, "name": ...,
    "strict": ...}}`` (the schema is enforced whatever ``strict`` says); here also a JSON Schema itself or
    a Pydantic model class, as `Constraint.json_schema` takes."""
    if isinstance(value, Constraint):
        return value
    if isinstance(value, type) or isinstance(value, (str, bytes, bytearray)):
        return Constraint.json_schema(value, field=field)
    if not isinstance(value, Mapping):
        raise ConstraintError(field, f"must be an object such as {{\"type\": \"json_object\"}}, a JSON "
                                     f"Schema or a Pydantic model class, got {type(value).__name__}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object(field=field)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise ConstraintError(f"{field}.json_schema", "must be an object with a \"schema\" key")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ConstraintError(f"{field}.json_schema.strict",
                                  f"must be true or false, got {_short(strict)}")
        return Constraint.json_schema(spec["schema"], field=f"{field}.json_schema.schema")
    return Constraint.json_schema(value, field=field)


#: The keyword arguments of the Python API that ask for a constraint.
CONSTRAINT_ARGUMENTS = ("constraint", "response_format", "json_schema", "regex", "choice", "grammar")


def constraint_from(**given: Any) -> Constraint | None:
    """The one constraint that keyword arguments (`CONSTRAINT_ARGUMENTS`, each None when not given) ask
    for: ``constraint`` (a `Constraint`, a JSON Schema or a Pydantic model class), ``response_format``
    (see `response_format`), ``json_schema``, ``regex``, ``choice`` (a list of strings), ``grammar``
    (Lark). Two of them at once is a `ConstraintError` naming the second."""
    unknown = sorted(set(given) - set(CONSTRAINT_ARGUMENTS))
    if unknown:
        raise ConstraintError(unknown[0], f"is not a constraint argument ({', '.join(CONSTRAINT_ARGUMENTS)})")
    asked = [(k, v) for k, v in given.items() if v is not None]
    if len(asked) > 1:
        raise ConstraintError(asked[1][0], f"cannot be given together with {asked[0][0]}: a generation "
                                           "takes one constraint")
    if not asked:
        return None
    name, value = asked[0]
    if name == "constraint" or name == "response_format":
        return response_format(value, field=name)
    build = {"json_schema": Constraint.json_schema, "regex": Constraint.regex, "choice": Constraint.choice,
             "grammar": Constraint.grammar}[name]
    return build(value, field=name)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _grammar(constraint: Constraint) -> str:
    """llguidance's grammar for `constraint` (raises ValueError for text it cannot read)."""
    llg = _llguidance(constraint.kind)
    m = llg.LLMatcher
    kind, source = constraint.kind, constraint.source
    if kind in ("json_schema", "json_object"):
        return m.grammar_from_json_schema(source, defaults=JSON_DEFAULTS)
    if kind == "regex":
        return m.grammar_from_regex(source)
    if kind == "choice":
        # Each choice as a Lark string literal: JSON's escapes are Lark's.
        return m.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(source)))
    return m.grammar_from_lark(source)


# ------------------------------------------------------------------------------- tokenizer and cache
_lock = threading.Lock()
_tokenizers: weakref.WeakKeyDictionary[Tokenizer, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_compiled_cache: weakref.WeakKeyDictionary[Tokenizer, OrderedDict[Constraint, llguidance.LLMatcher]] = \
    weakref.WeakKeyDictionary()


class _TokenizerView:
    """inferno's tokenizer as llguidance reads one (its ``TokenizerWrapper`` protocol): each id's bytes,
    the EOS and BOS ids, the special ids (never part of constrained text), and an encoder."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.tokens = [tokenizer._token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(set(tokenizer.special_tokens.values()) | set(tokenizer.eos_ids))
        self.is_tokenizer_wrapper = True

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text)


def lltokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer`, built once per tokenizer (a fraction of a second for GPT-2's)."""
    with _lock:
        ll = _tokenizers.get(tokenizer)
        if ll is None:
            llg = _llguidance("constraint")
            eos = list(tokenizer.eos_ids) or None
            ll = _tokenizers[tokenizer] = llg.LLTokenizer(_TokenizerView(tokenizer), eos_token=eos)
        return ll


def _compiled(constraint: Constraint, tokenizer: Tokenizer) -> llguidance.LLMatcher:
    """The matcher at the start of `constraint` for `tokenizer`, compiled once and kept (LRU)."""
    ll = lltokenizer(tokenizer)
    with _lock:
        cache = _compiled_cache.setdefault(tokenizer, OrderedDict())
        matcher = cache.get(constraint)
        if matcher is not None:
            cache.move_to_end(constraint)
            return matcher
    llg = _llguidance("constraint")
    matcher = llg.LLMatcher(ll, _grammar(constraint), log_level=0)
    if matcher.is_error():
        raise ConstraintError("constraint", matcher.get_error().strip())
    with _lock:
        cache[constraint] = matcher
        while len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
    return matcher


def clear_cache() -> None:
    """Forget every compiled constraint (benchmarks time compiling with it)."""
    with _lock:
        _compiled_cache.clear()


# ------------------------------------------------------------------------------------ one sequence
class ConstraintMatcher:
    """One sequence's place in its constraint: `allowed()` is the mask of ids that may come next (a
    boolean array over the tokenizer's ids, computed once per step), `consume` records the id chosen,
    `finished` says the constraint is complete and nothing may follow."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self._allowed: np.ndarray | None = None
        self._count = 0

    def allowed(self) -> np.ndarray:
        """The ids allowed next: a read-only boolean array of the tokenizer's vocabulary size."""
        if self._allowed is None:
            m = self._matcher
            m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
            if m.is_error():
                raise ConstraintFailure(f"the constraint library failed: {m.get_error()}")
            bits = np.unpackbits(self._words.view(np.uint8), count=self.vocab_size, bitorder="little")
            self._allowed = bits.view(bool)
            self._allowed.flags.writeable = False
            self._count = int(np.count_nonzero(bits))
        return self._allowed

    def mask(self, n: int) -> np.ndarray:
        """`allowed()` over the first `n` ids (the ids a model may produce); at least one is allowed."""
        allowed = self.allowed()[:n]
        if self._count == 0 or (n < self.vocab_size and not allowed.any()):
            raise ConstraintFailure("the constraint allows none of the ids this model may produce")
        return allowed

    @property
    def allowed_count(self) -> int:
        """How many ids `allowed()` allows."""
        self.allowed()
        return self._count

    def consume(self, token: int) -> None:
        """Record the id chosen (one `allowed()` allowed)."""
        self._allowed = None
        if not self._matcher.consume_token(int(token)):
            raise ConstraintFailure(f"the constraint refused token {token}: {self._matcher.get_error()}")

    @property
    def accepting(self) -> bool:
        """The text so far satisfies the constraint (it may still go on)."""
        return self._matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """The text so far satisfies the constraint and no more text may follow."""
        m = self._matcher
        return m.is_stopped() and not m.is_error()
