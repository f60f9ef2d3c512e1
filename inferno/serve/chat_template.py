"""Chat templates: a conversation (OpenAI's ``messages``) to the one prompt GPT-2 continues.

GPT-2 was never trained on turns, so no template is its own. The default is plain text, a line per
message with its role as a prefix, then the assistant's prefix for the reply::

    System: You answer briefly.
    User: What is the capital of France?
    Assistant:

and the reply ends where the model starts the next turn: at a line starting ``User:``, ``Assistant:``
or ``System:`` (`DEFAULT_STOPS`; none of them is part of the reply), besides ``<|endoftext|>``.
Roles: ``system`` and ``developer`` are ``System``, ``tool`` is ``Tool``; a message's text parts are
joined. The reply usually starts with a space (GPT-2's words carry theirs in front).

``inferno serve --chat-template FILE`` takes a Jinja2 template in Hugging Face's format (the
``chat_template`` of a tokenizer_config.json, as a file of its own), rendered as `transformers` renders
it: jinja2's ImmutableSandboxedEnvironment (a template cannot reach Python's internals or change its
inputs), ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter,
``raise_exception(message)`` and ``strftime_now(format)``; variables ``messages`` (dicts of role and
content), ``add_generation_prompt`` (true), ``bos_token`` and ``eos_token`` (``<|endoftext|>``). With
a template of one's own, a reply ends at ``<|endoftext|>``, ``stop`` or its token budget only.
jinja2 is imported only when a template is given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

#: The default template's role prefixes, and where a reply ends.
ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant",
              "tool": "Tool"}
DEFAULT_STOPS = ("\nUser:", "\nAssistant:", "\nSystem:")


class ChatTemplateError(ValueError):
    """A template that cannot be read or compiled (at startup), or that refuses a conversation."""


def message_text(content: str | Sequence[Any] | None) -> str:
    """A message's content as text: a string as is, text parts joined, null as empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


class ChatTemplate:
    """Renders a conversation to a prompt; `stops` are the stop strings the template implies."""

    stops: tuple[str, ...] = DEFAULT_STOPS

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        lines = [f"{ROLE_NAMES[m['role']]}: {m['content']}" for m in messages]
        return "\n".join([*lines, "Assistant:"])


class JinjaChatTemplate(ChatTemplate):
    """A Hugging Face chat template (Jinja2), compiled once, rendered in jinja2's sandbox."""

    stops = ()

    def __init__(self, source: str, *, bos_token: str, eos_token: str,
                 origin: str = "the chat template") -> None:
        try:
            import jinja2
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ChatTemplateError('a chat template needs jinja2: pip install "inferno-gpt2[serve]"') \
                from None

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"{origin}, line {exc.lineno}: {exc.message}") from None
        self._errors = (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError)
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token}

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=True, **self._tokens)
        except self._errors as exc:
            raise ChatTemplateError(f"the chat template refused these messages: {exc}") from None


def read_chat_template(path: str | Path) -> str:
    """The text of a --chat-template FILE; a `ChatTemplateError` names the file and what is wrong, and a
    file that does not compile is refused here, at startup, not at the first request."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ChatTemplateError(f"{path} is not a file" if p.exists() else f"{path} does not exist")
    if p.stat().st_size > 1 << 20:
        raise ChatTemplateError(f"{path} is larger than 1 MiB; a chat template is a few kilobytes")
    try:
        source = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"{path}: {exc}") from None
    JinjaChatTemplate(source, bos_token="", eos_token="", origin=str(path))  # compiles, or says where not
    return source
