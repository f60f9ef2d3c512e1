"""Chat templates: a conversation (OpenAI's ``messages``) to the one prompt a model continues.

A model's own template is the ``chat_template`` of its tokenizer_config.json (or its chat_template.jinja),
a Jinja2 template in Hugging Face's format, rendered here as `transformers`' ``apply_chat_template``
renders it: jinja2's ImmutableSandboxedEnvironment (a template cannot reach Python's internals or
change its inputs), ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and the
``{% generation %}`` tag, a ``tojson`` filter that does not escape HTML, ``raise_exception(message)``,
``strftime_now(format)``, ``dict`` and a ``namespace`` that refuses ``_`` names; variables ``messages``
(dicts of role and content), ``add_generation_prompt``, ``tools`` and ``documents`` (None),
``bos_token`` and ``eos_token``.

GPT-2 was never trained on turns, so no template is its own. Its default is plain text, a line per
message with its role as a prefix, then the assistant's prefix for the reply::

    System: You answer briefly.
    User: What is the capital of France?
    Assistant:

and the reply ends where the model starts the next turn: at a line starting ``User:``, ``Assistant:``
or ``System:`` (`DEFAULT_STOPS`; none of them is part of the reply), besides the end of text.
Roles: ``system`` and ``developer`` are ``System``, ``tool`` is ``Tool``; a message's text parts are
joined. With a Jinja2 template, a reply ends at the model's EOS ids, ``stop`` or its token budget only.

Any error a template raises while rendering (its own ``raise_exception``, a ZeroDivisionError, a
RecursionError, a sandbox refusal) is a `ChatTemplateError`, a ValueError with a one-line message: the
conversation is refused, the server answers 400. jinja2 is imported only when a Jinja2 template is
used, never by importing this module.

`model_template` is the one way every front end (the server, ``inferno chat``, ``inferno batch``, the
``llm`` plugin) finds a model's template and its BOS/EOS texts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_STOPS", "ROLE_NAMES", "ChatTemplate", "ChatTemplateError", "JinjaChatTemplate",
           "load_chat_template", "message_text", "model_template", "template_source"]

#: The default template's role prefixes, and where a reply ends.
ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant",
              "tool": "Tool"}
DEFAULT_STOPS = ("\nUser:", "\nAssistant:", "\nSystem:")
#: A chat template is a few kilobytes (Qwen3's, among the longest, 4 KB); a tokenizer_config.json with
#: its added tokens up to a few hundred.
MAX_TEMPLATE_FILE_BYTES = 4 << 20


class ChatTemplateError(ValueError):
    """A template that cannot be read or compiled (at startup), or that refuses a conversation."""


def message_text(content: str | Sequence[Any] | None) -> str:
    """A message's content as text: a string as is, text parts joined, null as empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ChatTemplate:
    """Renders a conversation to a prompt; `stops` are the stop strings the template implies."""

    stops: tuple[str, ...] = DEFAULT_STOPS

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        lines = [f"{ROLE_NAMES[m['role']]}: {m['content']}" for m in messages]
        return "\n".join([*lines, "Assistant:"] if add_generation_prompt else lines)


class JinjaChatTemplate(ChatTemplate):
    """A Hugging Face chat template (Jinja2), compiled once, rendered in jinja2's sandbox."""

    stops = ()

    def __init__(self, source: str, *, bos_token: str | None = "", eos_token: str | None = "",
                 origin: str = "the chat template") -> None:
        try:
            import jinja2
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ChatTemplateError('a chat template needs jinja2: pip install "inferno-gpt2[serve]"') \
                from None

        class Generation(jinja2.ext.Extension):
            """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's tokens with
            it; here its body is rendered as is."""

            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

            def _render(self, caller: Any) -> str:
                return caller()

        class Namespace(jinja2.utils.Namespace):
            """jinja2's namespace without ``_`` attributes (as transformers: no way to CPython's)."""

            def __init__(*args: Any, **kwargs: Any) -> None:
                self, args = args[0], args[1:]
                attrs = dict(*args, **kwargs)
                for name in attrs:
                    Namespace._check(name)
                jinja2.utils.Namespace.__init__(self, attrs)

            def __setitem__(self, name: str, value: Any) -> None:
                Namespace._check(name)
                jinja2.utils.Namespace.__setitem__(self, name, value)

            @staticmethod
            def _check(name: Any) -> None:
                if isinstance(name, str) and name.startswith("_"):
                    raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': "
                                                          f"{name!r}")

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
        env.globals["namespace"] = Namespace
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"{origin}, line {exc.lineno}: {_one_line(exc.message or exc)}") from None
        except (RecursionError, MemoryError, OverflowError, ValueError) as exc:  # too deep, too big
            raise ChatTemplateError(f"{origin} does not compile: {type(exc).__name__}") from None
        # A token the tokenizer lacks is left undefined (it renders as nothing), as transformers does.
        tokens = {"bos_token": bos_token, "eos_token": eos_token}
        self._tokens = {name: text for name, text in tokens.items() if text is not None}

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The prompt for `messages`; `variables` are more template variables (``enable_thinking``...).
        Whatever the template raises becomes a `ChatTemplateError`."""
        context = {"tools": None, "documents": None, **self._tokens, **variables}
        try:
            text = self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         **context)
        except RecursionError:
            raise ChatTemplateError("the chat template refused these messages: it recursed too deeply") \
                from None
        except Exception as exc:  # a template is code: anything it raises refuses this conversation
            what = str(exc) if str(exc) else type(exc).__name__
            if type(exc).__module__.split(".")[0] != "jinja2" and str(exc):
                what = f"{type(exc).__name__}: {exc}"
            raise ChatTemplateError(f"the chat template refused these messages: {_one_line(what)}") from None
        return text


def template_source(value: Any, origin: str) -> str:
    """The template text of a ``chat_template`` field: a string, or a list of named templates (the one
    named "default"), as tokenizer_config.json holds them."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) for t in value):
        named = {t.get("name"): t.get("template") for t in value}
        if isinstance(named.get("default"), str):
            return named["default"]
        names = ", ".join(repr(n) for n in named)
        raise ChatTemplateError(f"{origin}: chat_template lists templates named {names}, none 'default'")
    raise ChatTemplateError(f"{origin}: chat_template is not a string nor a list of named templates")


def load_chat_template(path: str | os.PathLike[str]) -> str:
    """The text of a --chat-template FILE: a Jinja2 template, or a tokenizer_config.json (its
    ``chat_template`` field; of a list of named templates, the "default" one). A `ChatTemplateError`
    names the file and what is wrong in one line; a template that does not compile is refused here, at
    startup, not at the first request."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ChatTemplateError(f"{path} is not a file" if p.exists() else f"{path} does not exist")
    if p.stat().st_size > MAX_TEMPLATE_FILE_BYTES:
        raise ChatTemplateError(f"{path} is larger than {MAX_TEMPLATE_FILE_BYTES >> 20} MiB: not a chat "
                                "template nor a tokenizer_config.json")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"{path}: {_one_line(exc)}") from None
    if text.lstrip().startswith("{") and not text.lstrip().startswith(("{{", "{%", "{#")):
        # JSON: a tokenizer_config.json (a Jinja2 template starts with text or a tag, never a bare "{").
        try:
            config = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ChatTemplateError(f"{path} is neither a Jinja2 chat template nor a tokenizer_config.json "
                                    f"(invalid JSON: {_one_line(exc, 120)})") from None
        if not isinstance(config, dict) or "chat_template" not in config:
            raise ChatTemplateError(f"{path} is JSON without a chat_template field: neither a Jinja2 chat "
                                    "template nor a tokenizer_config.json that has one")
        text = template_source(config["chat_template"], str(path))
    JinjaChatTemplate(text, origin=str(path))  # compiles, or says where not
    return text


def model_template(tokenizer: Any, source: str | None = None, *,
                   eos_token_id: int | None = None) -> JinjaChatTemplate | None:
    """The chat template a model's conversations are rendered with, compiled: `source` (the text of a
    ``--chat-template``, see `load_chat_template`) when given, else the model's own (`tokenizer`'s
    ``chat_template``, from its tokenizer_config.json or chat_template.jinja); None when there is neither
    (GPT-2). ``bos_token`` and ``eos_token`` are the texts tokenizer_config.json names (one it leaves out
    is undefined, as in transformers); a tokenizer that names neither (GPT-2's vocab.json and merges.txt)
    gets the text of its end-of-text token for both (`eos_token_id`, else the tokenizer's first EOS id).
    A template that does not compile, or jinja2 missing, is a `ChatTemplateError`."""
    own = getattr(tokenizer, "chat_template", None)
    if source is None and own is not None:
        source = template_source(own, "the model's tokenizer_config.json")
    if source is None:
        return None
    bos, eos = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "eos_token", None)
    if bos is None and eos is None:
        eos_id = getattr(tokenizer, "eos_id", None) if eos_token_id is None else eos_token_id
        names = {i: t for t, i in getattr(tokenizer, "special_tokens", {}).items()}
        bos = eos = names.get(eos_id, "")
    return JinjaChatTemplate(source, bos_token=bos, eos_token=eos)

