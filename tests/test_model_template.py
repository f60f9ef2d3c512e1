"""`inferno.chat_template.model_template` (#41): the one place the server, ``inferno chat``, ``inferno batch``
and the llm plugin find a model's chat template and its BOS/EOS texts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import inferno
from inferno.chat_template import ChatTemplateError, JinjaChatTemplate, model_template
from inferno.testing import LLAMA_CHAT_TEMPLATE, make_llama_model

pytest.importorskip("jinja2")

SHOW = "[{{ bos_token }}|{{ eos_token }}]{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
TURN = [{"role": "user", "content": "Hi"}]


def tokenizer(**fields) -> SimpleNamespace:
    base = {"chat_template": None, "bos_token": None, "eos_token": None, "eos_id": 7,
            "special_tokens": {"<|endoftext|>": 7, "<|other|>": 9}}
    return SimpleNamespace(**{**base, **fields})


def test_a_model_of_its_own_template_renders_with_its_bos_and_eos(tmp_path):
    pipe = inferno.load(str(make_llama_model(tmp_path, "llama", seed=2)), "numpy")
    template = model_template(pipe.tokenizer)
    want = JinjaChatTemplate(LLAMA_CHAT_TEMPLATE, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert template is not None and template.render(TURN) == want.render(TURN)
    assert template.render(TURN).startswith("<|begin_of_text|><|start_header_id|>user")


def test_an_override_wins_and_none_is_none():
    assert model_template(tokenizer()) is None  # GPT-2: no template of its own
    own = tokenizer(chat_template=SHOW, bos_token="<s>", eos_token="</s>")
    assert model_template(own).render(TURN) == "[<s>|</s>]user:Hi;"
    assert model_template(own, "{{ eos_token }}!").render(TURN) == "</s>!"
    # A list of named templates: the "default" one.
    named = tokenizer(chat_template=[{"name": "rag", "template": "R"}, {"name": "default", "template": "D"}])
    assert model_template(named).render(TURN) == "D"


def test_bos_and_eos_texts():
    # Neither named (GPT-2's files): the end-of-text token's text for both, by the model's EOS id.
    assert model_template(tokenizer(), SHOW).render([]) == "[<|endoftext|>|<|endoftext|>]"
    assert model_template(tokenizer(), SHOW, eos_token_id=9).render([]) == "[<|other|>|<|other|>]"
    # One named: the other stays undefined (renders as nothing), as transformers has it.
    assert model_template(tokenizer(eos_token="</s>"), SHOW).render([]) == "[|</s>]"
    assert model_template(tokenizer(eos_id=None, special_tokens={}), SHOW).render([]) == "[|]"


def test_a_template_that_does_not_compile_is_a_chat_template_error():
    with pytest.raises(ChatTemplateError, match="line 1"):
        model_template(tokenizer(chat_template="{% if %}"))
    with pytest.raises(ChatTemplateError, match="none 'default'"):
        model_template(tokenizer(chat_template=[{"name": "rag", "template": "R"}]))
