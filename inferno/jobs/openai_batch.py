"""Lines of OpenAI's Batch API input format in ``inferno batch``: ``{"custom_id", "method", "url", "body"}``,
where `body` is a ``POST /v1/completions`` or ``POST /v1/chat/completions`` request, run as the server
would run it; each result is written in the Batch API's output shape (``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``, the body a ``text_completion`` or a ``chat.completion``
object).

A chat body's ``messages`` are rendered with the model's own chat template when the line is checked
against the model (`inferno.jobs.chat`); a model without one refuses the line. The body's ``model`` is a
label only (the model is the one ``-m`` names): it is written back in the response body, as a client that
joins on it expects.
"""

from __future__ import annotations

import difflib
import time
import uuid
from collections.abc import Callable
from typing import Any

from inferno.jobs.chat import read_messages
from inferno.jobs.constraints import CONSTRAINT_KEYS
from inferno.jobs.lines import LineError, describe

#: The keys of a Batch API line.
BATCH_KEYS = ("custom_id", "method", "url", "body")
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
#: Body fields passed on as the generation option (or structured-output field) of the same name.
_SAME_NAME = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
              "repetition_penalty", "logit_bias", *CONSTRAINT_KEYS)
#: Body fields accepted only with the one value inferno supports (None: absent or null), per endpoint.
_ONLY = {COMPLETIONS: {"n": (1,), "best_of": (1,), "echo": (False,), "stream": (False,), "suffix": ("",),
                       "stream_options": ()},
         CHAT: {"n": (1,), "stream": (False,), "stream_options": ()}}
#: The fields both kinds of body may have.
_COMMON = ("model", "top_k", "stop_token_ids", "ignore_eos", "user", *_SAME_NAME)
#: Every body field a request may have here, per endpoint.
BODY_KEYS = {COMPLETIONS: ("prompt", "max_tokens", "logprobs", *_COMMON, *_ONLY[COMPLETIONS]),
             CHAT: ("messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                    *_COMMON, *_ONLY[CHAT])}
#: OpenAI's defaults where they are not inferno's (a chat reply's budget: up to the context's end).
DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0


def is_batch_line(obj: dict[str, Any]) -> bool:
    """Whether a line is in the Batch API's format (it has any of its keys)."""
    return any(key in obj for key in BATCH_KEYS)


def native_line(obj: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(custom_id, the request as a native `inferno batch` line without its id, what the response needs)
    of a Batch API line, or a `LineError` naming the key or body field that cannot run (carrying the
    custom_id when it was read). A chat line's native request has ``messages`` for a prompt, and no
    ``max_new_tokens`` when the body gives no budget (the reply may run to the context's end)."""
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(f"custom_id must be a non-empty string, got {describe(custom_id)} (a line of "
                        f"OpenAI's Batch API format has {', '.join(BATCH_KEYS)})")
    try:
        return custom_id, *_request(obj)
    except LineError as exc:
        raise LineError(str(exc), custom_id) from None


def _request(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    unknown = [key for key in obj if key not in BATCH_KEYS]
    if unknown:
        raise LineError(f"unknown key {unknown[0]!r} in a line of OpenAI's Batch API format (its keys: "
                        f"{', '.join(BATCH_KEYS)})")
    method = obj.get("method", "POST")
    if method != "POST":
        raise LineError(f"method must be \"POST\", got {describe(method)}")
    url = obj.get("url")
    if url not in (COMPLETIONS, CHAT):
        raise LineError(f"url must be {COMPLETIONS!r} or {CHAT!r} (the endpoints inferno batch runs), got "
                        f"{describe(url)}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError(f"body must be an object (a {url} request), got {describe(body)}")
    body = {key: value for key, value in body.items() if value is not None}  # null: the default
    native = _common(body, url)
    if url == CHAT:
        return _chat(body, native), {"model": body.get("model", "inferno"), "url": CHAT}
    native = _completion(body, native)
    return native, {"model": body.get("model", "inferno"), "prompt": native["prompt"]}


def _common(body: dict[str, Any], url: str) -> dict[str, Any]:
    """The native fields of what both endpoints share; a `LineError` for a field that cannot run."""
    known = BODY_KEYS[url]
    unknown = [key for key in body if key not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise LineError(f"body: unknown field {unknown[0]!r} ({hint}known: {', '.join(known)})")
    for key, allowed in _ONLY[url].items():
        if key in body and body[key] not in allowed:
            only = f"only {describe(allowed[0])} or null" if allowed else "only null"
            raise LineError(f"body.{key}: {describe(body[key])} is not supported ({only})")
    for key in ("model", "user"):
        if key in body and not isinstance(body[key], str):
            raise LineError(f"body.{key} must be a string, got {describe(body[key])}")
    native: dict[str, Any] = {"temperature": body.get("temperature", DEFAULT_TEMPERATURE)}
    native.update({key: body[key] for key in _SAME_NAME if key in body and key != "temperature"})
    if "top_k" in body:
        native["top_k"] = 0 if body["top_k"] == -1 else body["top_k"]  # -1: off, as vLLM has it
    if "stop_token_ids" in body:
        native["stop_ids"] = body["stop_token_ids"]
    if "ignore_eos" in body:
        if not isinstance(body["ignore_eos"], bool):
            raise LineError(f"body.ignore_eos must be true or false, got {describe(body['ignore_eos'])}")
        native["stop_at_eos"] = not body["ignore_eos"]
    return native


def _budget(body: dict[str, Any], key: str) -> int:
    n = body[key]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise LineError(f"body.{key} must be an integer >= 0, got {describe(n)}")
    return n


def _completion(body: dict[str, Any], native: dict[str, Any]) -> dict[str, Any]:
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a list of one prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise LineError(f"body.prompt: {len(prompt)} prompts in one request are not supported; give each its "
                        "own line")
    n = _budget(body, "max_tokens") if "max_tokens" in body else DEFAULT_MAX_TOKENS
    native.update(prompt=prompt, max_new_tokens=n)
    if "logprobs" in body:
        native["logprobs"] = body["logprobs"]
    return native


def _chat(body: dict[str, Any], native: dict[str, Any]) -> dict[str, Any]:
    if "messages" not in body:
        raise LineError('body.messages is missing: a chat request has a list of messages '
                        '({"role", "content"})')
    if body.get("tools"):
        raise LineError("body.tools: tool calling is not supported (only an empty list or null)")
    native["messages"] = read_messages(body["messages"], "body.messages")
    # max_completion_tokens wins over max_tokens (deprecated by OpenAI for it), as the server has it.
    for key in ("max_completion_tokens", "max_tokens"):
        if key in body:
            native["max_new_tokens"] = _budget(body, key)
            break
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise LineError(f"body.logprobs must be true or false, got {describe(logprobs)}")
    top = body.get("top_logprobs")
    if top is not None and not logprobs:
        raise LineError("body.top_logprobs needs logprobs: true")
    if logprobs:
        native["logprobs"] = 0 if top is None else top
    return native


def token_bytes(tokenizer: Any) -> Callable[[int], bytes]:
    """A token id's bytes (a chat completion's logprobs give them), from `tokenizer`."""
    # The tokenizer has no public id -> bytes accessor yet (the server's TokenTexts reads the same).
    return getattr(tokenizer, "token_bytes", None) or tokenizer._token_bytes


def response_line(custom_id: str, meta: dict[str, Any], prompt_ids: list[int], result: dict[str, Any],
                  token_text: Callable[[int], str],
                  token_bytes: Callable[[int], bytes] | None = None) -> dict[str, Any]:
    """The Batch API output line of a finished request: `result` is what ``inferno --json`` prints;
    `token_text` and `token_bytes` give a token's text and bytes for logprobs (bytes: its text's UTF-8
    when not given)."""
    if meta.get("url") == CHAT:
        choice = _chat_choice(result, token_text, token_bytes or (lambda i: token_text(i).encode()))
        kind, prefix = "chat.completion", "chatcmpl-"
    else:
        choice = _text_choice(meta, prompt_ids, result, token_text)
        kind, prefix = "text_completion", "cmpl-"
    new = len(result["ids"])
    body = {"id": f"{prefix}{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": meta["model"], "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": new,
                      "total_tokens": len(prompt_ids) + new}}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex}", "body": body},
            "error": None}


def _text_choice(meta: dict[str, Any], prompt_ids: list[int], result: dict[str, Any],
                 token_text: Callable[[int], str]) -> dict[str, Any]:
    """A completion's choice, its logprobs in the completions API's shape."""
    choice: dict[str, Any] = {"text": result["text"], "index": 0, "logprobs": None,
                              "finish_reason": result["finish_reason"]}
    if "logprobs" in result:
        start = len(meta["prompt"]) if isinstance(meta["prompt"], str) else len(
            "".join(map(token_text, prompt_ids)))
        offsets, at = [], start
        for entry in result["logprobs"]:
            offsets.append(at)
            at += len(entry["text"])
        choice["logprobs"] = {
            "tokens": [e["text"] for e in result["logprobs"]],
            "token_logprobs": [e["logprob"] for e in result["logprobs"]],
            "top_logprobs": [{t["text"]: t["logprob"] for t in e["top"]} for e in result["logprobs"]],
            "text_offset": offsets,
        }
    return choice


def _chat_choice(result: dict[str, Any], token_text: Callable[[int], str],
                 token_bytes: Callable[[int], bytes]) -> dict[str, Any]:
    """A chat completion's choice: the assistant's message, its logprobs in the chat API's shape (a
    ``content`` list of ``token``, ``logprob``, ``bytes`` and ``top_logprobs``)."""
    def entry(e: dict[str, Any]) -> dict[str, Any]:
        return {"token": token_text(e["id"]), "logprob": e["logprob"], "bytes": list(token_bytes(e["id"]))}

    logprobs = None
    if "logprobs" in result:
        logprobs = {"content": [{**entry(e), "top_logprobs": [entry(t) for t in e["top"]]}
                                for e in result["logprobs"]]}
    return {"index": 0, "message": {"role": "assistant", "content": result["text"]}, "logprobs": logprobs,
            "finish_reason": result["finish_reason"]}
