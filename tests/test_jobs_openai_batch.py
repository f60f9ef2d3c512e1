"""`inferno batch` on a file in OpenAI's Batch API format (inferno/jobs/openai_batch.py): /v1/completions
bodies run as the server runs them and come back in the Batch API's output shape, resumable by
custom_id; chat lines on a model without a chat template (tests/test_jobs_chat.py runs them on one that
has), other endpoints and unsupported fields are refused, each saying why; a file whose every line is
malformed ends with exit code 2 (it used to end with 0, having done nothing)."""

from __future__ import annotations

import json

import pytest
from cli_helpers import offline_env, run_inferno

from inferno.jobs.generate import parse_requests
from inferno.jobs.lines import LineError
from inferno.jobs.openai_batch import native_line


def _line(custom_id: str, body: dict, url: str = "/v1/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def env(tmp_path):
    return offline_env(tmp_path)


def test_completions_lines_run_and_come_back_in_the_batch_output_shape(model_dir, env, pipe, tmp_path):
    rows = [_line("r1", {"model": "gpt2", "prompt": "Hello there", "max_tokens": 4, "temperature": 0,
                         "logprobs": 2}),
            _line("r2", {"model": "my-label", "prompt": ["The quick brown fox"], "max_tokens": 3,
                         "temperature": 0, "stop": "\n", "n": 1, "stream": False}),
            _line("r3", {"prompt": [464, 2068], "temperature": 0})]  # max_tokens: OpenAI's default 16
    _write(tmp_path / "in.jsonl", rows)
    proc = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir), "--ignore-eos"], env,
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    got = {line["custom_id"]: line for line in lines}
    assert set(got) == {"r1", "r2", "r3"}
    for custom_id, prompt, n, model in (("r1", "Hello there", 4, "gpt2"),
                                        ("r2", "The quick brown fox", 3, "my-label"),
                                        ("r3", [464, 2068], 16, "inferno")):
        line = got[custom_id]
        assert set(line) == {"id", "custom_id", "response", "error", "input_hash"}
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        body = response["body"]
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert body["model"] == model and isinstance(body["created"], int)
        expected = pipe.generate(prompt, max_new_tokens=n, stop_at_eos=False,
                                 stop=("\n",) if custom_id == "r2" else ())
        prompt_tokens = len(pipe.encode(prompt))
        assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": len(expected.ids),
                                 "total_tokens": prompt_tokens + len(expected.ids)}
        [choice] = body["choices"]
        assert (choice["text"], choice["index"], choice["finish_reason"]) == (expected.text, 0,
                                                                             expected.finish_reason)
    logprobs = got["r1"]["response"]["body"]["choices"][0]["logprobs"]
    tokens = [pipe.tokenizer.decode([i]) for i in pipe.generate("Hello there", max_new_tokens=4).ids]
    assert logprobs["tokens"] == tokens and len(logprobs["token_logprobs"]) == 4
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == len("Hello there")
    assert got["r2"]["response"]["body"]["choices"][0]["logprobs"] is None

    # Resumed by custom_id: nothing runs again.
    again = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert again.returncode == 0 and "3 skipped (already in OUT)" in again.stderr, again.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3


def test_chat_lines_without_a_chat_template_are_refused_and_a_file_of_nothing_else_is_an_error(
        model_dir, env, tmp_path):
    chat = _line("c1", {"model": "gpt-3.5-turbo-0125", "messages": [{"role": "user", "content": "Hi"}]},
                 url="/v1/chat/completions")
    _write(tmp_path / "in.jsonl", [chat, {**chat, "custom_id": "c2"}])
    proc = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    said = proc.stderr.strip().splitlines()
    assert said[0] == ("inferno batch: in.jsonl:1: body.messages: the model has no chat template (no "
                       "chat_template in its tokenizer_config.json, no chat_template.jinja), so it cannot "
                       "take a conversation; give a prompt instead, or use a chat model "
                       "(-m smollm2-135m-instruct)")
    assert said[-1] == ("inferno batch: error: in.jsonl: every line (2) is malformed, as reported above; "
                        "nothing was generated")
    assert len(said) == 3 and not (tmp_path / "out.jsonl").exists()


def test_a_file_of_malformed_native_lines_exits_2(model_dir, env, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"custom_id": "x", "body": {"prompt": "Hi"}}\nnot json\n')
    proc = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "in.jsonl:1: url must be '/v1/completions'" in proc.stderr


@pytest.mark.parametrize(("row", "message"), [
    ({"custom_id": 7, "url": "/v1/completions", "body": {}},
     "custom_id must be a non-empty string, got 7 (a line of OpenAI's Batch API format has custom_id, "
     "method, url, body)"),
    ({**_line("a", {}), "prompt": "Hi"},
     "unknown key 'prompt' in a line of OpenAI's Batch API format (its keys: custom_id, method, url, body)"),
    ({**_line("a", {}), "method": "GET"}, 'method must be "POST", got "GET"'),
    (_line("a", {}, url="/v1/embeddings"),
     "url must be '/v1/completions' or '/v1/chat/completions' (the endpoints inferno batch runs), got "
     '"/v1/embeddings"'),
    ({**_line("a", {}), "body": "Hi"}, "body must be an object (a /v1/completions request), got \"Hi\""),
    (_line("a", {"prompt": "Hi", "n": 2}), "body.n: 2 is not supported (only 1 or null)"),
    (_line("a", {"prompt": "Hi", "echo": True}), "body.echo: true is not supported (only false or null)"),
    (_line("a", {"prompt": "Hi", "stream_options": {}}),
     "body.stream_options: dict is not supported (only null)"),
    (_line("a", {"prompt": ["a", "b"]}),
     "body.prompt: 2 prompts in one request are not supported; give each its own line"),
    (_line("a", {"prompt": "Hi", "max_tokens": -1}), "body.max_tokens must be an integer >= 0, got -1"),
    (_line("a", {"prompt": "Hi", "temprature": 0}), "body: unknown field 'temprature' (did you mean "
     "'temperature'? known: "),
    (_line("a", {"prompt": "Hi", "top_p": 0}), "body: top_p must be in (0, 1]"),
])
def test_what_cannot_run_is_refused_naming_the_key(row, message):
    [(line, said)] = parse_requests((json.dumps(row) + "\n").encode(), 50, True)[1]
    assert line == 1 and said.startswith(message), said


def test_openai_defaults_and_field_mapping():
    """OpenAI's defaults where they differ from a native line's (max_tokens 16, temperature 1), null as
    the default, top_k -1 as off, stop_token_ids and ignore_eos as inferno's stop_ids and stop_at_eos."""
    data = (json.dumps(_line("a", {"prompt": "Hi", "seed": None})) + "\n").encode()
    [req], errors = parse_requests(data, 50, True)
    assert errors == [] and (req.id, req.max_new_tokens, req.options.temperature) == ("a", 16, 1.0)
    assert req.stop_at_eos is True and req.openai == {"model": "inferno", "prompt": "Hi"}
    body = {"prompt": "Hi", "top_k": -1, "stop_token_ids": [13], "ignore_eos": True, "user": "me"}
    custom_id, native, _ = native_line(_line("b", body))
    assert custom_id == "b" and native["top_k"] == 0 and native["stop_ids"] == [13]
    assert native["stop_at_eos"] is False
    with pytest.raises(LineError) as info:
        native_line(_line("c", {"prompt": "Hi", "user": 5}))
    assert info.value.id == "c"  # the line still claims its id (a later duplicate is reported)
