"""inferno.chat_template: the model's own Jinja2 chat template rendered as transformers renders it, every
error a template raises while rendering one clean ChatTemplateError (#39, bug 9), and --chat-template
FILE taking a template or a tokenizer_config.json (#39).

The renders are compared with transformers' ``apply_chat_template(..., tokenize=False)`` on the real
Llama 3 and Qwen3 templates (tests/data/tokenizers/), marked ``oracle``.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inferno.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    JinjaChatTemplate,
    load_chat_template,
    template_source,
)
from inferno.tokenizer import Tokenizer

pytest.importorskip("jinja2")

DATA = Path(__file__).resolve().parent / "data" / "tokenizers"
SYSTEM = {"role": "system", "content": "You answer briefly."}
TURNS = [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "Paris."},
         {"role": "user", "content": "And of Italy? Say it   twice.\n"}]
CONVERSATIONS = {"one turn": TURNS[:1], "with a system message": [SYSTEM, *TURNS[:1]],
                 "multi-turn": TURNS, "multi-turn with a system message": [SYSTEM, *TURNS]}


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folders = {}
    for name in ("llama3", "qwen3"):
        folder = tmp_path_factory.mktemp(name)
        with gzip.open(DATA / name / "tokenizer.json.gz") as src:
            (folder / "tokenizer.json").write_bytes(src.read())
        shutil.copy(DATA / name / "tokenizer_config.json", folder)
        folders[name] = folder
    return folders


def _own_template(tok: Tokenizer) -> JinjaChatTemplate:
    return JinjaChatTemplate(template_source(tok.chat_template, "tokenizer_config.json"),
                             bos_token=tok.bos_token, eos_token=tok.eos_token)


# ------------------------------------------------------------------------------- against transformers
@pytest.mark.oracle
@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_the_models_own_template_renders_as_transformers_does(name: str, model_folders: dict[str, Path]
                                                               ) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(model_folders[name]), local_files_only=True)
    tok = Tokenizer.from_dir(model_folders[name])
    template = _own_template(tok)
    for what, messages in CONVERSATIONS.items():
        for generation_prompt in (True, False):
            want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
            got = template.render(messages, add_generation_prompt=generation_prompt)
            assert got == want, (what, generation_prompt)
        # And its ids: the special tokens of the render are recognised, no second BOS added.
        want_ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                          return_dict=False)
        assert tok.encode(template.render(messages), allow_special=True) == list(want_ids), what
    if name == "qwen3":  # a variable of the template's own
        want = hf.apply_chat_template(TURNS[:1], tokenize=False, add_generation_prompt=True,
                                      enable_thinking=False)
        assert template.render(TURNS[:1], enable_thinking=False) == want
        assert want.endswith("<think>\n\n</think>\n\n")


def test_the_llama3_template_starts_with_one_bos(model_folders: dict[str, Path]) -> None:
    tok = Tokenizer.from_dir(model_folders["llama3"])
    prompt = _own_template(tok).render([SYSTEM, *TURNS])
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou answer")
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tok.encode(prompt, allow_special=True)
    assert ids[0] == tok.bos_id == 128000 and ids.count(128000) == 1


# ------------------------------------------------------------------------------------ the environment
def test_importing_the_module_loads_no_jinja2() -> None:
    code = "import sys, inferno.chat_template; assert 'jinja2' not in sys.modules, 'jinja2 imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_sandbox_and_helpers_transformers_gives() -> None:
    source = ("{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content | tojson }};{% endfor %}"
              "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
              "{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}{{ ns.n }}"
              "{{ dict(a=1)['a'] }}{{ strftime_now('%Y')|length }}{% generation %}G{% endgeneration %}"
              "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}")
    t = JinjaChatTemplate(source, bos_token="<s>", eos_token="</s>")
    assert t.render([{"role": "user", "content": "é<b>"}]) == '<s>user="é<b>";114G></s>'
    assert t.render([{"role": "user", "content": "x"}], add_generation_prompt=False) == '<s>user="x";114G</s>'
    # trim_blocks and lstrip_blocks, as transformers sets them: a tag's own line leaves no blank.
    assert JinjaChatTemplate("a\n  {% if true %}\nb\n  {% endif %}\nc").render([]) == "a\nb\nc"
    # A missing token is undefined (empty), not the text "None".
    assert JinjaChatTemplate("[{{ bos_token }}]", bos_token=None).render([]) == "[]"


@pytest.mark.parametrize(("source", "needle"), [
    ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    ("{{ (2.0 ** 1000) ** 2 }}", "OverflowError"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "it recursed too deeply"),
    ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant roles"),
    ("{{ messages[7].content.upper() }}", "list object has no element 7"),
    ("{{ messages.append(1) }}", "unsafe"),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}", "may not start with '_'"),
    ("{{ '%d' % 'x' }}", "TypeError: %d format"),
    ("{{ 'x' * 10 ** 13 }}", "MemoryError"),
    ("{{ (10 ** (messages | length * 5000)) | string }}", "ValueError: Exceeds the limit"),
])
def test_any_error_while_rendering_is_one_chat_template_error(source: str, needle: str) -> None:
    template = JinjaChatTemplate(source)
    with pytest.raises(ChatTemplateError) as info:
        template.render([{"role": "user", "content": "hi"}])
    message = str(info.value)
    assert message.startswith("the chat template refused these messages: ") and needle in message, message
    assert "\n" not in message and isinstance(info.value, ValueError)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_template_that_does_not_compile_says_where() -> None:
    with pytest.raises(ChatTemplateError, match=r"^the chat template, line 2: Expected an expression"):
        JinjaChatTemplate("ok\n{% for %}")


def test_the_default_template_is_plain_text() -> None:
    assert ChatTemplate().render([SYSTEM, TURNS[0]]) == \
        "System: You answer briefly.\nUser: What is the capital of France?\nAssistant:"


# ------------------------------------------------------------------------------- --chat-template FILE
def test_a_jinja_file_is_read_as_is(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template(path) == "{% for m in messages %}{{ m.content }}{% endfor %}"


def test_a_tokenizer_config_gives_its_chat_template(tmp_path: Path) -> None:
    # Before: the JSON itself was taken as the template, and rendered literally into every prompt.
    path = tmp_path / "tokenizer_config.json"
    shutil.copy(DATA / "qwen3" / "tokenizer_config.json", path)
    assert load_chat_template(path) == json.loads(path.read_text())["chat_template"]
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ 'D' }}"}]
    path.write_text(json.dumps({"eos_token": "x", "chat_template": named}))
    assert load_chat_template(path) == "{{ 'D' }}"


@pytest.mark.parametrize(("content", "message"), [
    ('{"eos_token": "</s>"}', "is JSON without a chat_template field: neither a Jinja2 chat template nor a "
                              "tokenizer_config.json that has one"),
    ('{"chat_template": [{"name": "rag", "template": "R"}]}', "chat_template lists templates named 'rag', "
                                                              "none 'default'"),
    ('{"chat_template": 7}', "chat_template is not a string nor a list of named templates"),
    ('{"chat_template": "{% if %}"}', ", line 1: "),
    ('{"chat_template": ', "is neither a Jinja2 chat template nor a tokenizer_config.json (invalid JSON"),
    (b"\xff\xfe{{", "invalid start byte"),
])
def test_a_file_that_is_neither_is_refused_in_one_line(tmp_path: Path, content: str | bytes, message: str
                                                       ) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(ChatTemplateError) as info:
        load_chat_template(path)
    assert message in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_folders_and_huge_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="does not exist"):
        load_chat_template(tmp_path / "nope.jinja")
    with pytest.raises(ChatTemplateError, match="is not a file"):
        load_chat_template(tmp_path)
    big = tmp_path / "big.jinja"
    with big.open("wb") as f:
        f.truncate(5 << 20)
    with pytest.raises(ChatTemplateError, match="larger than 4 MiB"):
        load_chat_template(big)
