"""``POST /v1/chat/completions`` through the official OpenAI client (``chat.completions.create``,
streaming included) against a real server, checked against the in-process pipeline on the prompt the
chat template gives: the default plain template and a Jinja2 one from --chat-template."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from cli_helpers import assert_one_line_error
from serve_helpers import running, serve_command, server_env

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}]
#: MESSAGES as the default template writes them (docs/serving.md says so too).
RENDERED = "System: You answer briefly.\nUser: What is the capital of France?\nAssistant:"
#: "\n", "User", ":": biased up, a sampled reply soon writes the next turn's prefix.
NEXT_TURN_BIAS = {"198": 100, "12982": 100, "25": 100}


@pytest.fixture(scope="module")
def server(small_model_dir, tmp_path_factory):
    flags = ("--slots", "4", "--queue", "8", "--served-model-name", "gpt2")  # the model the requests name
    with running(small_model_dir, *flags, home=tmp_path_factory.mktemp("chat")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def chat(client, **kwargs):
    return client.chat.completions.create(model="gpt2", **{"messages": MESSAGES, **kwargs})


def test_greedy_reply_is_the_pipelines_continuation_of_the_rendered_prompt(client, small_pipe):
    r = chat(client, max_completion_tokens=8, temperature=0)
    ids = small_pipe.tokenizer.encode(RENDERED)
    ref = small_pipe.generate(ids, max_new_tokens=8, temperature=0.0, stop=["\nUser:", "\nAssistant:",
                                                                         "\nSystem:"])
    (c,) = r.choices
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model
    assert c.index == 0 and c.message.role == "assistant" and c.message.content == ref.text
    assert c.finish_reason == ref.finish_reason == "length" and c.logprobs is None
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(ref.ids) and r.usage.total_tokens == len(ids) + len(ref.ids)


def test_the_reply_stops_at_the_next_turns_prefix(client, server):
    kwargs = dict(max_tokens=60, temperature=1, seed=3, logit_bias=NEXT_TURN_BIAS)
    r = chat(client, **kwargs)
    (c,) = r.choices
    # The same sampling as a plain completion of the rendered prompt, which does not stop there.
    body = {"prompt": RENDERED, "max_tokens": 60, "temperature": 1, "seed": 3, "logit_bias": NEXT_TURN_BIAS}
    plain = httpx.post(server.url + "/v1/completions", timeout=60, json=body).json()
    text = plain["choices"][0]["text"]
    assert "\nUser:" in text  # else the test would prove nothing
    assert c.finish_reason == "stop" and c.message.content == text[: text.index("\nUser:")]


def test_streaming_with_n_usage_and_logprobs(client, small_pipe):
    stream = chat(client, max_tokens=5, temperature=0, n=2, logprobs=True, top_logprobs=3, stream=True,
                  stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    text = {0: "", 1: ""}
    roles, finish, entries = {}, {}, {0: [], 1: []}
    for ch in chunks[:-1]:
        (choice,) = ch.choices
        if choice.delta.role:
            roles[choice.index] = choice.delta.role
            assert choice.delta.content == "" and choice.index not in text or text[choice.index] == ""
        text[choice.index] += choice.delta.content or ""
        if choice.logprobs is not None:
            entries[choice.index] += choice.logprobs.content
        if choice.finish_reason:
            finish[choice.index] = choice.finish_reason
    assert roles == {0: "assistant", 1: "assistant"} and finish == {0: "length", 1: "length"}
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 10
    ref = small_pipe.generate(small_pipe.tokenizer.encode(RENDERED), max_new_tokens=5, temperature=0.0,
                              logprobs=3)
    for k in (0, 1):  # greedy: both choices are the pipeline's
        assert text[k] == ref.text
        assert [e.token for e in entries[k]] == [small_pipe.tokenizer.decode([i]) for i in ref.ids]
        for e, t in zip(entries[k], ref.logprobs, strict=True):
            assert e.logprob == pytest.approx(t.logprob, abs=1e-5)
            assert bytes(e.bytes).decode() == e.token
            assert [x.logprob for x in e.top_logprobs] == pytest.approx([lp for _, lp in t.top], abs=1e-5)
            assert len(e.top_logprobs) == 3


def test_non_streaming_logprobs_and_stop(client, small_pipe):
    r = chat(client, max_tokens=6, temperature=0, logprobs=True)  # top_logprobs not given: none
    (c,) = r.choices
    assert [e.top_logprobs for e in c.logprobs.content] == [[]] * len(c.logprobs.content)
    assert "".join(e.token for e in c.logprobs.content) == c.message.content
    words = c.message.content.split()
    stopped = chat(client, max_tokens=6, temperature=0, stop=[words[1]])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == c.message.content[: c.message.content.index(words[1])]


def test_max_completion_tokens_wins_over_max_tokens(client):
    r = chat(client, max_tokens=2, max_completion_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4
    r = chat(client, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_text_parts_and_every_role(client, small_pipe):
    messages = [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text",
                                                                                   "text": "kind."}]},
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "tool", "content": "42"}, {"role": "user", "content": "Thanks"}]
    r = client.chat.completions.create(model="gpt2", messages=messages, max_tokens=1, temperature=0)
    rendered = "System: Be kind.\nUser: Hi\nAssistant: Hello.\nTool: 42\nUser: Thanks\nAssistant:"
    assert r.usage.prompt_tokens == len(small_pipe.tokenizer.encode(rendered))


@pytest.mark.parametrize("kwargs, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"n": 5}, "n"),
    ({"stop": ["a"] * 14}, "stop"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x " * 200}]}, "messages"),  # longer than the context
])
def test_bad_requests_are_400_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, **{"max_tokens": 2, **kwargs})
    assert info.value.body["param"] == param and param in info.value.body["message"]


def test_models_is_unchanged_and_the_route_is_documented(client, server):
    assert [m.id for m in client.models.list().data] == ["gpt2"]  # --served-model-name
    doc = httpx.get(server.url + "/openapi.json", timeout=30).json()
    chat_doc = doc["paths"]["/v1/chat/completions"]["post"]
    assert "text/event-stream" in chat_doc["responses"]["200"]["content"]
    assert "ChatCompletionChunk" in json.dumps(chat_doc)


# ----------------------------------------------------------------------------- --chat-template

#: A template in Hugging Face's format; it also tries to change its input when the first message says
#: "mutate" (the immutable sandbox refuses), and refuses more than two turns with raise_exception.
TEMPLATE = ("{% if messages[0]['content'] == 'mutate' %}{{ messages.append(1) }}{% endif %}"
            "{% if messages|length > 2 %}{{ raise_exception('at most two turns') }}{% endif %}"
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_jinja_template_from_a_file(small_model_dir, small_pipe, tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    flags = ("--chat-template", str(path), "--served-model-name", "gpt2")
    with running(small_model_dir, *flags, home=tmp_path) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="gpt2", messages=MESSAGES, max_tokens=6, temperature=0)
        rendered = ("<|system|>You answer briefly.<|endoftext|>\n<|user|>What is the capital of France?"
                    "<|endoftext|>\n<|assistant|>")
        ids = small_pipe.tokenizer.encode(rendered, allow_special=True)
        assert ids.count(50256) == 2  # eos_token is the special token
        ref = small_pipe.generate(ids, max_new_tokens=6, temperature=0.0)  # no template stops
        assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == ref.text
        for messages, needle in (([{"role": "user", "content": "mutate"}], "unsafe"),
                                 (MESSAGES * 2, "at most two turns")):
            r = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={"messages": messages})
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
            assert needle in r.json()["error"]["message"]
        assert "Traceback" not in s.log()


#: A template that fails while rendering, in a way the first message picks (#39, bug 9: these were 500s
#: with a traceback).
FAULTY = ("{% macro down(n) %}{{ down(n + 1) }}{% endmacro %}{% set c = messages[0]['content'] %}"
          "{% if c == 'zero' %}{{ 1 / 0 }}{% elif c == 'overflow' %}{{ (2.0 ** 1000) ** 2 }}"
          "{% elif c == 'recurse' %}{{ down(0) }}"
          "{% elif c == 'huge' %}{{ (10 ** (c | length * 2000)) | string }}"
          "{% endif %}[{{ c }}]{{ eos_token }}")


def test_a_tokenizer_config_as_the_template_and_errors_while_rendering_are_400(small_model_dir, small_pipe,
                                                                               tmp_path):
    # --chat-template takes a tokenizer_config.json: its chat_template field is the template (it was
    # rendered literally before).
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"eos_token": "<|endoftext|>", "chat_template": FAULTY}))
    flags = ("--chat-template", str(path), "--served-model-name", "gpt2")
    with running(small_model_dir, *flags, home=tmp_path) as s:
        body = {"model": "gpt2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        ok = httpx.post(s.url + "/v1/chat/completions", timeout=60, json=body)
        assert ok.status_code == 200, ok.text
        ids = small_pipe.tokenizer.encode("[hi]<|endoftext|>", allow_special=True)
        assert ok.json()["usage"]["prompt_tokens"] == len(ids)
        for content, needle in (("zero", "ZeroDivisionError"), ("overflow", "OverflowError"),
                                ("recurse", "recursed too deeply"), ("huge", "ValueError")):
            r = httpx.post(s.url + "/v1/chat/completions", timeout=60,
                           json={"model": "gpt2", "messages": [{"role": "user", "content": content}]})
            assert r.status_code == 400, (content, r.status_code, r.text)
            error = r.json()["error"]
            assert error["param"] == "messages" and needle in error["message"], error
            assert error["message"].startswith("the chat template refused these messages: ")
        health = httpx.get(s.url + "/health", timeout=10)
        assert health.status_code == 200
        assert "Traceback" not in s.log()


@pytest.mark.parametrize("content, needles", [
    (None, ["--chat-template", "does not exist"]),
    ("{% for m in messages %}{{ m }", ["--chat-template", "line 1"]),
    ('{"eos_token": "</s>", "bos_token": "<s>"}', ["--chat-template", "JSON without a chat_template field"]),
])
def test_a_bad_template_file_is_one_line_and_exit_2(small_model_dir, tmp_path, content, needles):
    path = tmp_path / "t.jinja"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run(serve_command("--model-dir", str(small_model_dir), "--chat-template", str(path)),
                          capture_output=True, text=True, env=server_env(tmp_path), timeout=60)
    assert_one_line_error(proc, *needles)


def test_the_models_own_template_is_used_without_the_flag(small_model_dir, small_pipe, tmp_path):
    # A tokenizer that comes with a tokenizer_config.json's chat_template and tokens (as Llama 3's and
    # Qwen's do) renders the conversation with it; --chat-template still wins over it.
    from starlette.testclient import TestClient

    from inferno.api import Pipeline
    from inferno.serve import ServeConfig, create_app
    from inferno.tokenizer import Tokenizer

    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                  "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m.role }}>"
                                                   "{{ m.content }}{% endfor %}<assistant>"}))
    tok = Tokenizer.from_file(small_model_dir / "tokenizer.json", tokenizer_config=config)
    pipe = Pipeline(small_pipe.model, tok)
    rendered = "<|endoftext|><system>You answer briefly.<user>What is the capital of France?<assistant>"
    for flag, prompt in ((None, rendered), ("{{ 'X' }}", "X")):
        app = create_app(ServeConfig(model_dir=str(small_model_dir), backend="numpy", download=False,
                                     chat_template=flag), pipeline=pipe)
        with TestClient(app) as c:
            r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(prompt, allow_special=True)), flag


def test_a_model_folder_with_a_tokenizer_config_is_served_with_its_template(small_model_dir, small_pipe,
                                                                            tmp_path):
    # inferno.load reads the folder's tokenizer_config.json: the server renders with its chat_template.
    import shutil
    import time

    from starlette.testclient import TestClient

    from inferno.serve import ServeConfig, create_app

    folder = tmp_path / "chat-model"
    shutil.copytree(small_model_dir, folder)
    template = "{% for m in messages %}#{{ m.content }}{% endfor %}#"
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                              "chat_template": template}))
    app = create_app(ServeConfig(model_dir=str(folder), backend="numpy", download=False))
    with TestClient(app) as c:
        deadline = time.monotonic() + 60
        while c.get("/health").status_code != 200 and time.monotonic() < deadline:  # it loads in a thread
            time.sleep(0.05)
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})
    assert r.status_code == 200, r.text
    prompt = "#You answer briefly.#What is the capital of France?#"
    assert r.json()["usage"]["prompt_tokens"] == len(small_pipe.tokenizer.encode(prompt))
