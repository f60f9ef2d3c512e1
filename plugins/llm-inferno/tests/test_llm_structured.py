"""`llm --schema` through inferno's constrained decoding (#42), and conversations rendered with the model's
own chat template when it has one (#41). The model is the tiny random GPT-2 of conftest.py, sampled at
temperature 1: unconstrained, its text is gibberish, so JSON that parses and validates comes from the
constraint."""

from __future__ import annotations

import json
import re
import shutil

import inferno
import llm
import pytest
from click.testing import CliRunner
from llm.cli import cli

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "good": {"type": "boolean"}},
          "required": ["name", "age", "good"], "additionalProperties": False}
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def run_llm(*args: str):
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture(scope="module")
def pipe(model_dir) -> inferno.Pipeline:
    return inferno.load(model_dir, "numpy", download=False)


@pytest.mark.parametrize("seed", ["1", "2"])
def test_schema_output_parses_and_validates(model_dir, seed):
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(model_dir), "-o", "temperature", "1", "-o", "seed",
                     seed, "-o", "max_tokens", "80", "--schema", json.dumps(SCHEMA), "A dog:")
    assert result.exit_code == 0, result.output
    jsonschema.validate(json.loads(result.stdout), SCHEMA)


def test_llm_s_schema_dsl_too(model_dir):
    # llm turns its concise DSL into a JSON Schema whose two keys are required, and which allows more:
    # on random weights a run may add keys up to the budget (finish_reason "length"). Each run starts
    # with the two required keys, and one that ended validates.
    from llm.utils import schema_dsl

    schema = schema_dsl("good bool, tall bool")
    for seed in range(3):
        response = llm.get_model("gpt2").prompt("A dog:", schema=schema, model_dir=str(model_dir),
                                                 max_tokens=30, temperature=1.0, seed=seed)
        text = response.text()
        assert re.match(r'\{ ?"good": ?(true|false), ?"tall": ?(true|false) ?[,}]', text), text
        if response.response_json["finish_reason"] == "stop":
            jsonschema.validate(json.loads(text), schema)


def test_without_schema_the_same_run_is_not_json(model_dir):
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(model_dir), "-o", "temperature", "1", "-o", "seed",
                     "1", "-o", "max_tokens", "20", "A dog:")
    assert result.exit_code == 0, result.output
    with pytest.raises(ValueError):
        json.loads(result.stdout)


def test_a_schema_llguidance_refuses_is_one_error(model_dir):
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(model_dir), "--schema", '{"type": "bogus"}', "Hi")
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: inferno cannot constrain the output to this schema: ")
    assert "bogus" in result.output and "Traceback" not in result.output


def test_the_model_says_it_supports_schemas():
    assert llm.get_model("gpt2").supports_schema


@pytest.fixture(scope="module")
def chat_model_dir(model_dir, tmp_path_factory):
    """The same model with a tokenizer_config.json holding a chat template (as Llama 3's and Qwen's)."""
    folder = shutil.copytree(model_dir, tmp_path_factory.mktemp("chat") / "model")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "chat_template": TEMPLATE}))
    return folder


def test_a_conversation_is_rendered_with_the_model_s_chat_template(chat_model_dir):
    chat_pipe = inferno.load(chat_model_dir, "numpy", download=False)
    assert chat_pipe.tokenizer.chat_template == TEMPLATE
    conversation = llm.get_model("gpt2").conversation()
    options = {"model_dir": str(chat_model_dir), "max_tokens": 4}
    first = conversation.prompt("Hi", system="Be brief.", **options)
    first_text = first.text()
    second = conversation.prompt("And then?", system="Be brief.", **options)
    rendered = ("<|endoftext|><|system|>Be brief.<|endoftext|><|user|>Hi<|endoftext|><|assistant|>"
                f"{first_text}<|endoftext|><|user|>And then?<|endoftext|><|assistant|>")
    ids = chat_pipe.tokenizer.encode(rendered, allow_special=True)
    assert second.text() == chat_pipe.generate(ids, max_new_tokens=4).text
    assert second.usage().input == len(ids)
    first_ids = chat_pipe.tokenizer.encode(rendered[:rendered.index(first_text + "<|endoftext|><|user|>And")],
                                           allow_special=True)
    assert first.usage().input == len(first_ids)


def test_without_a_template_a_conversation_is_still_one_running_text(model_dir, pipe):
    # GPT-2 has none: the plugin's plain running text, as before.
    conversation = llm.get_model("gpt2").conversation()
    first = conversation.prompt("Hi", model_dir=str(model_dir), max_tokens=4).text()
    second = conversation.prompt(" and then", model_dir=str(model_dir), max_tokens=4).text()
    assert second == pipe.generate("Hi" + first + " and then", max_new_tokens=4).text


def test_schema_and_chat_template_together(chat_model_dir):
    response = llm.get_model("gpt2").prompt("A dog:", schema=SCHEMA, model_dir=str(chat_model_dir),
                                             max_tokens=80, temperature=1.0, seed=4)
    jsonschema.validate(json.loads(response.text()), SCHEMA)
