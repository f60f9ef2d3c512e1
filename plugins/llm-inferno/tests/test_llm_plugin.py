"""The plugin as a user runs it: `llm`'s own command line (click's runner, in this process), and llm's
Python API where the CLI cannot show something (the chunks of a stream, the recorded usage).

The oracle is inferno itself: each expected text is what a `Pipeline` loaded by the test, separately from
the plugin's cache, generates for the same model, prompt and options.
"""

from __future__ import annotations

import http.server
import shutil
import threading

import inferno
import llm
import pytest
from click.testing import CliRunner
from llm.cli import cli

MODEL_IDS = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", "random"]
OPTIONS = ["max_tokens", "temperature", "top_k", "top_p", "seed", "backend", "model_dir"]


@pytest.fixture(scope="module")
def pipe(model_dir) -> inferno.Pipeline:
    """The test's own Pipeline on the model, loaded apart from the plugin's."""
    return inferno.load(model_dir, "numpy", download=False)


def run_llm(*args: str):
    result = CliRunner().invoke(cli, list(args))
    # A crash inside llm or the plugin is an exception other than click's exit; never a user's error.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def generate(model_dir, prompt: str, *options: str):
    """`llm -m gpt2 -o model_dir DIR OPTIONS... PROMPT`; its exit code is checked to be 0."""
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(model_dir), *options, prompt)
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\n"), result.stdout
    return result.stdout[:-1]  # llm ends the streamed text with one newline


def test_models_are_listed():
    out = run_llm("models").stdout
    for model_id in MODEL_IDS:
        assert f"Inferno: {model_id}" in out, out
    assert "Inferno: gpt2 (aliases: openai-community/gpt2)" in out
    assert "Inferno: distilgpt2 (aliases: distilbert/distilgpt2)" in out


def test_options_are_listed_with_streaming():
    out = run_llm("models", "--options").stdout
    start = out.index("Inferno: gpt2 ")
    section = out[start:out.index("Inferno: ", start + 1)]  # up to the next model, gpt2-medium
    for name in OPTIONS:
        assert f"{name}:" in section, section
    if "Features:" in section:  # llm lists features since 0.23
        assert "- streaming" in section, section


@pytest.mark.parametrize("prompt", ["Hi", "The quick brown fox", "¿Dónde está la biblioteca?"])
def test_greedy_text_is_inferno_s(model_dir, pipe, prompt):
    expected = pipe.generate(prompt, max_new_tokens=5)
    assert expected.new_tokens == 5 and expected.text  # five real tokens, so a wrong count shows
    assert generate(model_dir, prompt, "-o", "max_tokens", "5") == expected.text


def test_defaults_are_inferno_s(model_dir, pipe):
    # No options but the folder: inferno's default budget (50 tokens) and greedy decoding.
    expected = pipe.generate("Once upon a time")
    assert expected.new_tokens == 50
    assert generate(model_dir, "Once upon a time") == expected.text


def test_the_alias_runs_the_same_model(model_dir, pipe):
    result = run_llm("-m", "openai-community/gpt2", "-o", "model_dir", str(model_dir), "-o", "max_tokens",
                     "4", "Hi")
    assert result.exit_code == 0, result.output
    assert result.stdout == pipe.generate("Hi", max_new_tokens=4).text + "\n"


def test_sampling_options_reach_inferno(model_dir, pipe):
    options = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 7}
    expected = pipe.generate("Hi", max_new_tokens=8, **options).text
    assert expected != pipe.generate("Hi", max_new_tokens=8).text  # sampling is not greedy on this model
    flags = [x for name, value in options.items() for x in ("-o", name, str(value))]
    assert generate(model_dir, "Hi", "-o", "max_tokens", "8", *flags) == expected


def test_same_seed_same_text_other_seeds_differ(model_dir):
    def sample(seed: int) -> str:
        return generate(model_dir, "Hi", "-o", "max_tokens", "8", "-o", "temperature", "1", "-o", "seed",
                        str(seed))

    assert sample(3) == sample(3)
    assert len({sample(seed) for seed in (1, 2, 3)}) == 3


@pytest.mark.parametrize("cut", [["-o", "top_k", "1"], ["-o", "top_p", "1e-9"]])
def test_a_cut_to_one_token_is_greedy(model_dir, pipe, cut):
    # At temperature 1 these options alone make the text greedy: if either were dropped, the seeded
    # sample would differ (the previous tests show it does).
    sampled = generate(model_dir, "Hi", "-o", "max_tokens", "8", "-o", "temperature", "1", "-o", "seed", "1",
                       *cut)
    assert sampled == pipe.generate("Hi", max_new_tokens=8).text
    assert sampled != pipe.generate("Hi", max_new_tokens=8, temperature=1.0, seed=1).text


def test_no_stream_gives_the_same_text(model_dir, pipe):
    result = run_llm("-m", "gpt2", "--no-stream", "-o", "model_dir", str(model_dir), "-o", "max_tokens", "6",
                     "Hi")
    assert result.exit_code == 0, result.output
    assert result.stdout == pipe.generate("Hi", max_new_tokens=6).text + "\n"


def test_streams_token_by_token_and_records_usage(model_dir, pipe):
    expected = pipe.generate("The quick brown fox", max_new_tokens=8)
    response = llm.get_model("gpt2").prompt("The quick brown fox", model_dir=str(model_dir), max_tokens=8)
    chunks = list(response)
    assert len(chunks) > 1 and "".join(chunks) == expected.text
    assert (response.input_tokens, response.output_tokens) == (len(expected.prompt_ids), 8)
    assert response.response_json == {"finish_reason": "length", "backend": "numpy", "ids": expected.ids}


def test_backend_option(model_dir, pipe):
    response = llm.get_model("gpt2").prompt("Hi", model_dir=str(model_dir), max_tokens=5, backend="array-api")
    assert response.text() == pipe.generate("Hi", max_new_tokens=5).text
    assert response.response_json["backend"] == "array-api"
    assert generate(model_dir, "Hi", "-o", "max_tokens", "5", "-o", "backend", "array-api") == response.text()


@pytest.fixture
def loads(monkeypatch) -> list[tuple]:
    """The positional arguments of every `inferno.load` call the plugin makes from here on."""
    calls = []
    real_load = inferno.load

    def counting_load(*args, **kwargs):
        calls.append(args)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(inferno, "load", counting_load)
    return calls


def test_the_pipeline_is_loaded_once_per_model_and_backend(model_dir, tmp_path, loads):
    folder = shutil.copytree(model_dir, tmp_path / "copy")  # a folder no earlier test has loaded
    for _ in range(2):
        generate(folder, "Hi", "-o", "max_tokens", "2")
    assert len(loads) == 1
    generate(folder, "Hi", "-o", "max_tokens", "2", "-o", "backend", "array-api")
    generate(folder, "Hi", "-o", "max_tokens", "2", "-o", "backend", "array-api")
    assert [args[1] for args in loads] == [None, "array-api"]


def test_a_conversation_is_one_running_text(model_dir, pipe):
    first = generate(model_dir, "Hi", "-o", "max_tokens", "4")
    result = run_llm("-c", "-o", "model_dir", str(model_dir), "-o", "max_tokens", "4", " and then")
    assert result.exit_code == 0, result.output
    assert result.stdout == pipe.generate("Hi" + first + " and then", max_new_tokens=4).text + "\n"


def test_llm_chat_loads_once_and_keeps_the_running_text(model_dir, pipe, tmp_path, loads):
    folder = shutil.copytree(model_dir, tmp_path / "copy")
    args = ["chat", "-m", "gpt2", "-o", "model_dir", str(folder), "-o", "max_tokens", "4"]
    result = CliRunner().invoke(cli, args, input="Hi\n and then\nexit\n")
    assert result.exit_code == 0, result.output
    first = pipe.generate("Hi", max_new_tokens=4).text
    second = pipe.generate("Hi" + first + " and then", max_new_tokens=4).text
    # Each reply is a line of its own, after the "> " prompt where click does not echo the input.
    replies = [line.removeprefix("> ") for line in result.stdout.splitlines()]
    assert first in replies and second in replies[replies.index(first) + 1:], result.stdout
    assert len(loads) == 1


def test_the_system_prompt_comes_first(model_dir, pipe):
    out = generate(model_dir, "Hi", "-s", "A story.", "-o", "max_tokens", "4")
    assert out == pipe.generate("A story.\n\nHi", max_new_tokens=4).text


@pytest.mark.parametrize("name, value, needles", [
    ("temperature", "-1", ["temperature", "greater than or equal to 0"]),
    ("temperature", "hot", ["temperature", "valid number"]),
    ("temperature", "inf", ["temperature", "finite number"]),
    ("top_p", "0", ["top_p", "greater than 0"]),
    ("top_p", "1.5", ["top_p", "less than or equal to 1"]),
    ("top_k", "-2", ["top_k", "greater than or equal to 0"]),
    ("max_tokens", "2.5", ["max_tokens", "valid integer"]),
    ("max_tokens", "-1", ["max_tokens", "greater than or equal to 0"]),
    ("seed", "-1", ["seed", "greater than or equal to 0"]),
    ("backend", "", ["backend", "at least 1 character"]),
    ("temprature", "1", ["temprature", "Extra inputs are not permitted"]),
])
def test_a_bad_option_is_llm_s_validation_error(model_dir, name, value, needles):
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(model_dir), "-o", name, value, "Hi")
    assert_one_error(result, *needles)


def assert_one_error(result, *needles: str) -> None:
    assert result.exit_code == 1 and result.stdout == ""
    assert result.output.startswith("Error: ") and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in result.output, result.output


def test_a_missing_model_dir(tmp_path):
    missing = tmp_path / "nowhere"
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(missing), "Hi")
    assert_one_error(result, "model_dir", f"no folder at '{missing}'")


@pytest.fixture
def hub(monkeypatch) -> list[str]:
    """A Hub endpoint on 127.0.0.1 that answers 404 and records the paths asked for, with downloads
    allowed (HF_ENDPOINT points at it); stopped after the test."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_error(404)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    yield asked
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_model_dir_without_the_files(tmp_path, hub):
    (tmp_path / "empty").mkdir()
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(tmp_path / "empty"), "Hi")
    assert_one_error(result, str(tmp_path / "empty"), "config.json", "model.safetensors", "tokenizer.json")
    # A model_dir is used as it is: nothing is fetched into it, although downloads are allowed.
    assert hub == [] and not any((tmp_path / "empty").iterdir())


def test_an_unknown_backend(model_dir):
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(model_dir), "-o", "backend", "nope", "Hi")
    assert_one_error(result, "unknown backend 'nope'", "numpy")


def test_a_prompt_longer_than_the_context(model_dir):
    result = run_llm("-m", "gpt2", "-o", "model_dir", str(model_dir), "word " * 100)
    assert_one_error(result, "101 tokens", "context holds 64")


def test_the_random_model():
    try:
        expected = inferno.load("random").generate("Hi", max_new_tokens=3).text
    except FileNotFoundError:  # an inferno without the built-in random model: "random" is a folder name
        pytest.skip('this inferno has no inferno.load("random")')
    result = run_llm("-m", "random", "-o", "max_tokens", "3", "Hi")
    assert result.exit_code == 0, result.output
    assert result.stdout == expected + "\n"
