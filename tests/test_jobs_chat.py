"""Conversations in `inferno batch` (#41): Batch API lines of url /v1/chat/completions, and native lines with
``messages``, rendered with the model's own chat template (the prompt ids checked against the template
rendered here), generated with the body's options, stopped at every EOS id of the model, and written in
the Batch API's chat.completion shape; a model without a template, and a conversation that is not one,
refused per line naming the field."""

from __future__ import annotations

import json

import pytest

import inferno
from inferno.chat_template import JinjaChatTemplate
from inferno.jobs.generate import check_request, parse_requests
from inferno.jobs.lines import LineError
from inferno.testing import LLAMA_CHAT_TEMPLATE, make_llama_model

pytest.importorskip("jinja2")

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hello there"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random Llama model with Llama 3's chat-template shape; config.json names one EOS id (257),
    generation_config.json two (257 and 260), as a Llama 3 Instruct repo may."""
    path = make_llama_model(tmp_path_factory.mktemp("chat-llama"), "llama", seed=4,
                            max_position_embeddings=96, eos_token_id=257)
    return path, inferno.load(str(path), "numpy")


def _line(custom_id: str, body: dict, url: str = CHAT) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _parse(*rows: dict) -> tuple[list, list]:
    return parse_requests("".join(json.dumps(r) + "\n" for r in rows).encode(), 50, True)


def _rendered(messages: list[dict]) -> str:
    return JinjaChatTemplate(LLAMA_CHAT_TEMPLATE, bos_token="<|begin_of_text|>",
                             eos_token="<|eot_id|>").render(messages, add_generation_prompt=True)


def batch(monkeypatch, capsys, tmp_path, model, rows, *flags) -> tuple[int, list[dict], str]:
    from inferno.cli import main

    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    code = main(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model), *flags])
    out = tmp_path / "out.jsonl"
    lines = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    return code, lines, capsys.readouterr().err


def test_the_prompt_is_the_chat_templates_render(llama):
    _, pipe = llama
    parts = {"role": "user",
             "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}
    [a, b, c], errors = _parse(_line("a", {"messages": [SYSTEM, USER], "max_tokens": 3}),
                               _line("b", {"messages": [SYSTEM, parts, {"role": "assistant", "content": None},
                                                        {"role": "user", "content": "he", "name": "me"}]}),
                               {"id": "c", "messages": [USER]})
    assert errors == []
    for req in (a, b, c):
        check_request(pipe, req)
    assert a.prompt == _rendered([SYSTEM, USER])
    assert a.prompt.startswith("<|begin_of_text|><|start_header_id|>")
    assert a.prompt_ids == pipe.tokenizer.encode(a.prompt, allow_special=True)
    assert a.prompt_ids[0] == 256 and a.prompt_ids.count(256) == 1  # the template's BOS, once, as a token
    assert b.prompt == _rendered([SYSTEM, USER, {"role": "assistant", "content": ""},
                                  {"role": "user", "content": "he"}])
    assert c.prompt == _rendered([USER]) and c.max_new_tokens == 50  # a native line: --max-new-tokens
    # A chat body without max_tokens may run to the context's end, as the server's; max_tokens 3 is 3.
    assert (a.max_new_tokens, b.max_new_tokens) == (3, pipe.config.n_positions)
    [d], _ = _parse(_line("d", {"messages": [USER], "max_tokens": 9, "max_completion_tokens": 2}))
    assert d.max_new_tokens == 2  # max_completion_tokens wins, as the server has it


def test_chat_lines_run_and_come_back_as_chat_completions(llama, monkeypatch, capsys, tmp_path):
    path, pipe = llama
    rows = [_line("c1", {"model": "my-label", "messages": [SYSTEM, USER], "max_tokens": 4, "temperature": 0,
                         "logprobs": True, "top_logprobs": 2}),
            _line("c2", {"messages": [USER], "max_completion_tokens": 5, "temperature": 0.8, "seed": 3,
                         "top_p": 0.9, "stop": ["\n"], "n": 1, "stream": False}),
            # The second EOS id (generation_config.json's only) ends the reply; ignore_eos runs on.
            _line("eos", {"messages": [USER], "max_tokens": 4, "logit_bias": {"260": 100}}),
            _line("on", {"messages": [USER], "max_tokens": 4, "logit_bias": {"260": 100},
                         "ignore_eos": True}),
            {"id": "n1", "messages": [USER], "max_new_tokens": 3},
            {"custom_id": "p1", "url": "/v1/completions", "body": {"prompt": "he", "max_tokens": 2}}]
    code, lines, err = batch(monkeypatch, capsys, tmp_path, path, rows)
    assert code == 0, err
    got = {line.get("custom_id", line["id"]): line for line in lines}
    assert set(got) == {"c1", "c2", "eos", "on", "n1", "p1"}
    ids = pipe.tokenizer.encode(_rendered([SYSTEM, USER]), allow_special=True)
    user_ids = pipe.tokenizer.encode(_rendered([USER]), allow_special=True)
    expect = {"c1": pipe.generate(ids, max_new_tokens=4, logprobs=2, temperature=0),
              "c2": pipe.generate(user_ids, max_new_tokens=5, temperature=0.8, seed=3, top_p=0.9,
                                  stop=["\n"]),
              "eos": pipe.generate(user_ids, max_new_tokens=4, temperature=1.0, logit_bias={260: 100}),
              "on": pipe.generate(user_ids, max_new_tokens=4, temperature=1.0, logit_bias={260: 100},
                                  stop_at_eos=False)}
    for custom_id, want in expect.items():
        line = got[custom_id]
        assert set(line) == {"id", "custom_id", "response", "error", "input_hash"}
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        body = response["body"]
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        assert body["model"] == ("my-label" if custom_id == "c1" else "inferno")
        assert isinstance(body["created"], int)
        [choice] = body["choices"]
        assert choice["index"] == 0 and choice["message"] == {"role": "assistant", "content": want.text}
        assert choice["finish_reason"] == want.finish_reason
        n = len(want.prompt_ids)
        assert body["usage"] == {"prompt_tokens": n, "completion_tokens": len(want.ids),
                                 "total_tokens": n + len(want.ids)}
    assert pipe.config.eos_token_ids == (257,) and 260 in pipe.tokenizer.eos_ids  # 260: the tokenizer's only
    eos = got["eos"]["response"]["body"]["choices"][0]
    assert expect["eos"].ids == [260] and eos["finish_reason"] == "stop" and eos["message"]["content"] == ""
    assert len(expect["on"].ids) == 4 and expect["on"].finish_reason == "length"
    content = got["c1"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [pipe.tokenizer.decode([i]) for i in expect["c1"].ids]
    assert [e["logprob"] for e in content] == pytest.approx([lp.logprob for lp in expect["c1"].logprobs])
    assert all(len(e["top_logprobs"]) == 2 and set(e) == {"token", "logprob", "bytes", "top_logprobs"}
               for e in content)
    assert b"".join(bytes(e["bytes"]) for e in content) == b"".join(
        pipe.tokenizer._token_bytes(i) for i in expect["c1"].ids)
    assert got["c2"]["response"]["body"]["choices"][0]["logprobs"] is None
    # A native line with messages: inferno's own output line, the rendered prompt's ids.
    assert got["n1"]["prompt_ids"] == user_ids
    assert got["n1"]["ids"] == pipe.generate(user_ids, max_new_tokens=3).ids
    assert got["p1"]["response"]["body"]["object"] == "text_completion"


def test_a_model_without_a_chat_template_refuses_each_chat_line(model_dir, monkeypatch, capsys, tmp_path):
    rows = [_line("c1", {"messages": [USER]}), {"id": "n1", "messages": [USER]},
            {"custom_id": "p1", "url": "/v1/completions", "body": {"prompt": "Hi", "max_tokens": 2}}]
    code, lines, err = batch(monkeypatch, capsys, tmp_path, model_dir, rows)
    assert code == 0 and [line["custom_id"] for line in lines] == ["p1"], err
    said = err.strip().splitlines()
    assert said[0].startswith("inferno batch: in.jsonl:1: body.messages: the model has no chat template "), \
        err
    assert said[1].startswith("inferno batch: in.jsonl:2: messages: the model has no chat template "), err
    assert "give a prompt instead" in said[0] and said[-1].endswith("2 malformed]")


def test_a_template_that_refuses_the_conversation_is_an_error_for_that_line(tmp_path, monkeypatch, capsys):
    strict = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system messages here') }}"
              "{% endif %}" + LLAMA_CHAT_TEMPLATE)
    path = make_llama_model(tmp_path / "m", "llama", seed=1, max_position_embeddings=64, chat_template=strict)
    rows = [_line("bad", {"messages": [SYSTEM, USER]}), _line("ok", {"messages": [USER], "max_tokens": 1}),
            _line("long", {"messages": [{"role": "user", "content": "he " * 200}]})]
    code, lines, err = batch(monkeypatch, capsys, tmp_path, path, rows)
    assert code == 0 and [line["custom_id"] for line in lines] == ["ok"], err
    assert ("in.jsonl:1: body.messages: the chat template refused these messages: no system messages "
            "here") in err
    assert ("in.jsonl:3: body.messages (rendered by the chat template): the prompt is 422 tokens long but "
            "the model's context holds 64") in err


@pytest.mark.parametrize(("row", "message"), [
    (_line("a", {}), "body.messages is missing: a chat request has a list of messages"),
    (_line("a", {"messages": []}), "body.messages must be a non-empty list of messages"),
    (_line("a", {"messages": "Hi"}), 'body.messages must be a non-empty list of messages ({"role", '
                                     '"content"}), got "Hi"'),
    (_line("a", {"messages": [{"role": "bot", "content": "x"}]}),
     'body.messages[0].role must be one of system, developer, user, assistant, tool, got "bot"'),
    (_line("a", {"messages": [USER, {"role": "user", "content": 5}]}),
     "body.messages[1].content must be a string, a list of text parts or null, got 5"),
    (_line("a", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
     'body.messages[0].content[0] must be a text part {"type": "text", "text": ...}, got dict'),
    (_line("a", {"messages": [{**USER, "tool_calls": []}]}),
     "body.messages[0].tool_calls is not supported (a message has role, content, name)"),
    (_line("a", {"messages": [USER], "tools": [{"type": "function"}]}), "body.tools: tool calling is not "
     "supported"),
    (_line("a", {"messages": [USER], "n": 2}), "body.n: 2 is not supported (only 1 or null)"),
    (_line("a", {"messages": [USER], "logprobs": 2}), "body.logprobs must be true or false, got 2"),
    (_line("a", {"messages": [USER], "top_logprobs": 2}), "body.top_logprobs needs logprobs: true"),
    (_line("a", {"messages": [USER], "max_completion_tokens": -1}),
     "body.max_completion_tokens must be an integer >= 0, got -1"),
    (_line("a", {"messages": [USER], "prompt": "Hi"}), "body: unknown field 'prompt' (known: messages, "),
    (_line("a", {"messages": [USER], "echo": True}), "body: unknown field 'echo' "),
    (_line("a", {"messages": [USER], "temprature": 0}), "body: unknown field 'temprature' (did you mean "
     "'temperature'? "),
    (_line("a", {"messages": [USER], "response_format": {"type": "xml"}}),
     'body: response_format.type must be "text", "json_object" or "json_schema", got "xml"'),
    ({"id": "n", "messages": [USER], "prompt": "Hi"}, '"prompt" and "messages" both give the prompt'),
    ({"id": "n", "messages": [{"content": "Hi"}]}, "messages[0].role must be one of "),
    ({"id": "n"}, 'no "prompt" (text, or a list of token ids; "" for unconditional text) nor "messages"'),
])
def test_what_cannot_run_is_refused_naming_the_field(row, message):
    [(line, said)] = _parse(row)[1]
    assert line == 1 and said.startswith(message), said


def test_chat_options_map_to_generation_options():
    body = {"messages": [USER], "max_tokens": 7, "top_k": -1, "stop": "x", "stop_token_ids": [13],
            "presence_penalty": 0.5, "logprobs": True, "user": "me", "tools": [], "seed": None,
            "guided_choice": ["yes", "no"]}
    [req], errors = _parse(_line("a", body))
    assert errors == [] and req.openai == {"model": "inferno", "url": CHAT}
    o = req.options
    assert (req.max_new_tokens, o.temperature, o.top_k, o.stop, o.stop_ids) == (7, 1.0, 0, ("x",),
                                                                               frozenset({13}))
    assert (o.presence_penalty, o.logprobs, o.seed) == (0.5, 0, None)
    assert o.constraint is not None and o.constraint.kind == "choice"
    assert req.messages == [{"role": "user", "content": "Hello there"}] and req.stop_at_eos


def test_check_names_the_field_for_a_model_without_a_template(pipe):
    [req], _ = _parse({"id": "n", "messages": [USER]})
    with pytest.raises(LineError, match=r"^messages: the model has no chat template"):
        check_request(pipe, req)
