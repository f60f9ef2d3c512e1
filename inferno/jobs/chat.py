"""Conversations in job lines: a ``messages`` list (OpenAI's chat format), checked when the line is read and
rendered with the model's own chat template (`inferno.chat_template.model_template`) when the line is
checked against the model, into the prompt text the model continues.

A message is ``{"role", "content", "name"?}``: role ``system``, ``developer``, ``user``, ``assistant`` or
``tool``; content a string, a list of text parts (``{"type": "text", "text": ...}``, joined) or null (an
empty turn). Anything else in a message is an error naming it (``body.messages[1].tool_calls``). A model
without a chat template (GPT-2) refuses the line: it has no format of its own for turns.
"""

from __future__ import annotations

import weakref
from typing import Any

from inferno.jobs.lines import LineError, describe

#: The roles a message may have (as the server takes them).
ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "name")

#: The compiled template of each loaded model (None: it has none), made at its first conversation.
_templates: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def read_messages(value: Any, field: str) -> list[dict[str, str]]:
    """The conversation of a line's `field` (``messages`` or ``body.messages``) as the template's messages
    (role and content text), or a `LineError` naming what is wrong."""
    if not isinstance(value, list) or not value:
        raise LineError(f"{field} must be a non-empty list of messages ({{\"role\", \"content\"}}), got "
                        f"{describe(value)}")
    return [_message(m, f"{field}[{k}]") for k, m in enumerate(value)]


def _message(m: Any, where: str) -> dict[str, str]:
    if not isinstance(m, dict):
        raise LineError(f"{where} must be an object {{\"role\", \"content\"}}, got {describe(m)}")
    unknown = [key for key in m if key not in MESSAGE_KEYS]
    if unknown:
        raise LineError(f"{where}.{unknown[0]} is not supported (a message has {', '.join(MESSAGE_KEYS)})")
    role = m.get("role")
    if role not in ROLES:
        raise LineError(f"{where}.role must be one of {', '.join(ROLES)}, got {describe(role)}")
    if m.get("name") is not None and not isinstance(m["name"], str):
        raise LineError(f"{where}.name must be a string, got {describe(m['name'])}")
    return {"role": role, "content": _content(m.get("content"), f"{where}.content")}


def _content(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not _text_part(part):
                raise LineError(f"{where}[{k}] must be a text part {{\"type\": \"text\", \"text\": ...}}, "
                                f"got {describe(part)} (the model reads only text)")
            texts.append(part["text"])
        return "".join(texts)
    raise LineError(f"{where} must be a string, a list of text parts or null, got {describe(content)}")


def _text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) \
        and set(part) <= {"type", "text"}


def chat_prompt(pipe: Any, messages: list[dict[str, str]], field: str) -> str:
    """The prompt text the model's chat template renders for `messages`, ending with the assistant's turn
    to speak; a `LineError` naming `field` when the model has no template or the template refuses them."""
    from inferno.chat_template import ChatTemplateError, model_template

    try:
        template = _templates[pipe]
    except KeyError:
        try:
            template = model_template(pipe.tokenizer, eos_token_id=pipe.config.eos_token_id)
        except ChatTemplateError as exc:
            template = exc  # said for every line that needs it
        _templates[pipe] = template
    if isinstance(template, ChatTemplateError):
        raise LineError(f"{field}: the model's chat template cannot be used: {template}")
    if template is None:
        raise LineError(f"{field}: the model has no chat template (no chat_template in its "
                        "tokenizer_config.json, no chat_template.jinja), so it cannot take a conversation; "
                        "give a prompt instead, or use a chat model (-m smollm2-135m-instruct)")
    try:
        return template.render(messages, add_generation_prompt=True)
    except ChatTemplateError as exc:
        raise LineError(f"{field}: {exc}") from None
