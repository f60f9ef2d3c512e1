"""llm-inferno: GPT-2 in simonw's `llm`, run in this process by inferno.

    llm install -e plugins/llm-inferno
    llm -m gpt2 "The quick brown fox"
    llm -m gpt2 -o temperature 0.8 -o top_k 40 -o seed 1 "Once upon a time"
    llm -m gpt2 -o model_dir ./my-gpt2 -o backend cpu-threaded "Hello"
    llm -m gpt2 --schema '{"type": "object", "properties": {"name": {"type": "string"}}}' "A dog:"

It uses inferno's public API only: `inferno.load`, the `Pipeline`'s token stream, `inferno.structured`
for ``--schema`` (the output is held to the schema by constrained decoding; needs
``inferno-gpt2[structured]``) and `inferno.chat_template` for the conversations of a model that has a
chat template of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import inferno
import llm
from pydantic import Field, field_validator

__version__ = "0.1.0"

#: The llm model ids, which are also the names `inferno.load` takes, and their Hub repo ids as aliases.
MODELS: dict[str, tuple[str, ...]] = {
    "gpt2": ("openai-community/gpt2",),
    "gpt2-medium": ("openai-community/gpt2-medium",),
    "gpt2-large": ("openai-community/gpt2-large",),
    "gpt2-xl": ("openai-community/gpt2-xl",),
    "distilgpt2": ("distilbert/distilgpt2",),
    "random": (),  # random weights at the 124M shape: gibberish by design, no download
}

#: `Pipeline.generate`'s own default, so `llm -m gpt2` and `inferno` write as much by default.
DEFAULT_MAX_TOKENS = 50

#: The options passed to inferno under the same name (GenerationOptions keywords).
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")


@llm.hookimpl
def register_models(register) -> None:
    for model_id, aliases in MODELS.items():
        register(Inferno(model_id), aliases=aliases)


# Loaded pipelines by (model name or model folder, backend): `llm chat` and Python callers prompt the same
# model many times in one process, and loading is the slow part.
_pipelines: dict[tuple[str, str | None], inferno.Pipeline] = {}
_lock = threading.Lock()


def load_pipeline(name: str, model_dir: str | None, backend: str | None) -> inferno.Pipeline:
    """The cached `Pipeline` for `model_dir` (a local folder, used as it is) or else the model `name`
    (inferno resolves and downloads it), on `backend`; a load failure is an `llm.ModelError`."""
    source = str(Path(model_dir).expanduser().resolve()) if model_dir is not None else name
    key = (source, backend)
    with _lock:
        if key not in _pipelines:
            try:
                if model_dir is not None:
                    _pipelines[key] = inferno.load(source, backend, download=False)
                else:
                    _pipelines[key] = inferno.load(source, backend)
            except (OSError, ValueError, RuntimeError) as e:
                # inferno's load errors are one line naming the file, field or backend; llm shows
                # ModelError's message as "Error: ..." instead of a traceback.
                raise llm.ModelError(f"inferno could not load {source!r}: {e}") from e
        return _pipelines[key]


def chat_template(pipe: inferno.Pipeline):
    """The model's own chat template (its tokenizer_config.json's ``chat_template``), compiled, with
    the model's BOS and EOS texts (`inferno.chat_template.model_template`); None when it has none
    (GPT-2). A template that does not compile, or jinja2 missing, is an `llm.ModelError`."""
    from inferno.chat_template import ChatTemplateError, model_template

    try:
        return model_template(pipe.tokenizer, eos_token_id=pipe.config.eos_token_id)
    except ChatTemplateError as e:
        raise llm.ModelError(f"inferno cannot use the model's chat template: {e}") from e


def chat_prompt(template, prompt: llm.Prompt, conversation: llm.Conversation | None) -> str:
    """The conversation up to this prompt rendered by the model's `template`, ending with the assistant's
    turn to speak: every system prompt, prompt and reply as a message (empty system prompts left out;
    a system prompt repeated on each turn, as ``llm chat -s`` gives it, said once)."""
    from inferno.chat_template import ChatTemplateError

    messages: list[dict[str, str]] = []
    for role, text in _turns(prompt, conversation):
        if role == "system" and (not text or any(m == {"role": "system", "content": text} for m in messages)):
            continue
        messages.append({"role": role, "content": text})
    try:
        return template.render(messages)
    except ChatTemplateError as e:
        raise llm.ModelError(str(e)) from e


def schema_constraint(schema: dict):
    """``--schema``'s JSON Schema as an `inferno.structured.Constraint`; a schema the constraint library
    refuses, or the library missing, is an `llm.ModelError` saying why."""
    from inferno.structured import Constraint, ConstraintError

    try:
        return Constraint.json_schema(schema, field="schema")
    except ConstraintError as e:
        raise llm.ModelError(f"inferno cannot constrain the output to this schema: {e.reason}") from e


def prompt_text(prompt: llm.Prompt, conversation: llm.Conversation | None) -> str:
    """The text GPT-2 continues. It has no chat format, so a conversation is one running text: the
    first system prompt and a blank line, then every earlier prompt followed by its continuation, then
    this prompt, joined exactly as written."""
    turns = _turns(prompt, conversation)
    system = next((text for role, text in turns if role == "system" and text), "")
    parts = [system + "\n\n"] if system else []
    parts += [text for role, text in turns if role in ("user", "assistant")]
    return "".join(parts)


def _turns(prompt: llm.Prompt, conversation: llm.Conversation | None) -> list[tuple[str, str]]:
    """(role, text) of each message of the conversation up to this prompt, oldest first."""
    messages = getattr(prompt, "messages", None)
    if messages is not None:
        # llm >= 0.32 gives the whole chain here (a conversation continued with `llm -c` is read back
        # from the logs into it, not into conversation.responses).
        from llm.parts import TextPart

        return [(m.role, "".join(p.text for p in m.parts if isinstance(p, TextPart))) for m in messages]
    turns = []
    for earlier in conversation.responses if conversation is not None else []:
        turns += [("system", earlier.prompt.system or ""), ("user", earlier.prompt.prompt or ""),
                  ("assistant", earlier.text())]
    return turns + [("system", prompt.system or ""), ("user", prompt.prompt or "")]


class Inferno(llm.Model):
    can_stream = True
    supports_schema = True

    class Options(llm.Options):
        max_tokens: int | None = Field(
            default=None, ge=0, description=f"Tokens to generate at most (default {DEFAULT_MAX_TOKENS})")
        temperature: float | None = Field(
            default=None, ge=0, allow_inf_nan=False,
            description="Sampling temperature; 0, the default, is greedy (the most likely token each time)")
        top_k: int | None = Field(
            default=None, ge=0,
            description="Sample among the k most likely tokens only (0, the default: off)")
        top_p: float | None = Field(
            default=None, gt=0, le=1,
            description="Sample among the most likely tokens whose probabilities add up to p (1: off)")
        seed: int | None = Field(
            default=None, ge=0, description="Seed for sampling: the same seed gives the same text")
        backend: str | None = Field(
            default=None, min_length=1,
            description="inferno backend, optionally with options: numpy, cpu-threaded, half, "
                        "torch:device=cuda ... (default $INFERNO_BACKEND, else numpy; see "
                        "`inferno backends`)")
        model_dir: str | None = Field(
            default=None, min_length=1,
            description="A local folder holding config.json, model.safetensors and tokenizer.json, loaded "
                        "instead of the model's name (nothing is downloaded)")

        @field_validator("model_dir")
        @classmethod
        def _is_a_folder(cls, value: str | None) -> str | None:
            if value is not None and not os.path.isdir(os.path.expanduser(value)):
                raise ValueError(f"no folder at {value!r} (it should hold config.json, model.safetensors "
                                 "and tokenizer.json)")
            return value

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def execute(self, prompt: llm.Prompt, stream: bool, response: llm.Response,
                conversation: llm.Conversation | None = None) -> Iterator[str]:
        options = prompt.options
        pipe = load_pipeline(self.model_id, options.model_dir, options.backend)
        sampling = {name: getattr(options, name) for name in SAMPLING_OPTIONS
                    if getattr(options, name) is not None}
        max_tokens = DEFAULT_MAX_TOKENS if options.max_tokens is None else options.max_tokens
        if prompt.schema:
            sampling["constraint"] = schema_constraint(prompt.schema)
        template = chat_template(pipe)
        if template is None:
            text: str | list[int] = prompt_text(prompt, conversation)
        else:  # the template writes the special tokens it needs as text: read them as such
            text = pipe.tokenizer.encode(chat_prompt(template, prompt, conversation), allow_special=True)
        # A bad prompt (too long for the context) is a ValueError with one line, which llm shows as is.
        tokens = pipe.tokens(text, max_tokens, **sampling)
        # Each step's text is released once it is whole (a character split across tokens is held back).
        for step in tokens.steps():
            if step.text:
                yield step.text
        result = tokens.result()
        response.set_usage(input=len(result.prompt_ids), output=result.new_tokens)
        response.response_json = {"finish_reason": result.finish_reason, "backend": result.backend,
                                  "ids": result.ids}
