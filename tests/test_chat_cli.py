"""`inferno chat` (#41): messages piped on stdin, each rendered with the model's own chat template over the
whole history (checked against the template rendered here, with the replies generation gives), /reset,
/exit, --system, --chat-template FILE, and exit 2 for a model without a template."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import inferno
from inferno.testing import LLAMA_CHAT_TEMPLATE, make_llama_model

pytest.importorskip("jinja2")

BLOCK = re.compile(r"--- prompt \((\d+) tokens\) ---\n(.*?)\n--- end of prompt ---\n", re.S)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_llama_model(tmp_path_factory.mktemp("chat"), "llama", seed=5, max_position_embeddings=256)


def chat(args: list[str], stdin: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONIOENCODING": "utf-8"}
    env.pop("INFERNO_BACKEND", None)
    return subprocess.run([sys.executable, "-m", "inferno", "chat", *args], input=stdin.encode(),
                          capture_output=True, env=env, timeout=timeout)


def render(messages: list[dict]) -> str:
    from inferno.chat_template import JinjaChatTemplate

    return JinjaChatTemplate(LLAMA_CHAT_TEMPLATE, bos_token="<|begin_of_text|>",
                             eos_token="<|eot_id|>").render(messages, add_generation_prompt=True)


def test_history_system_and_reset(model):
    proc = chat(["-m", str(model), "-n", "6", "--system", "Be brief.", "--show-prompt"],
                "Hello there\nhe the\n/reset\n\nagain\n/exit\nnever sent\n")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    prompts = [text for _, text in BLOCK.findall(err)]
    assert len(prompts) == 3, err  # the empty line is skipped; nothing after /exit
    pipe = inferno.load(str(model), "numpy")
    system = {"role": "system", "content": "Be brief."}
    first = [system, {"role": "user", "content": "Hello there"}]
    assert prompts[0] == render(first)
    reply = pipe.generate(pipe.tokenizer.encode(prompts[0], allow_special=True), max_new_tokens=6).text
    assert prompts[1] == render([*first, {"role": "assistant", "content": reply},
                                 {"role": "user", "content": "he the"}])
    assert "history cleared" in err
    assert prompts[2] == render([system, {"role": "user", "content": "again"}])  # after /reset
    counts = [int(n) for n, _ in BLOCK.findall(err)]
    assert counts[0] == len(pipe.tokenizer.encode(prompts[0], allow_special=True))
    assert proc.stdout.decode("utf-8", "replace").startswith(reply)


def in_process(monkeypatch, capsys, args: list[str], stdin: str) -> tuple[int, str, str]:
    """`inferno chat ARGS` in this process, `stdin` piped (not a terminal): (exit code, stdout, stderr)."""
    from inferno.cli import main

    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(["chat", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_model_without_a_chat_template_is_exit_2_unless_one_is_given(tmp_path, monkeypatch, capsys):
    bare = make_llama_model(tmp_path / "bare", "llama", seed=1, chat_template=None)
    code, out, err = in_process(monkeypatch, capsys, ["-m", str(bare)], "hi\n")
    assert code == 2 and err.count("\n") == 1 and out == "", err
    assert err.startswith("inferno: error: model ") and "has no chat template" in err
    assert "--chat-template FILE" in err
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    code, out, err = in_process(monkeypatch, capsys, ["-m", str(bare), "--chat-template", str(template),
                                                      "--show-prompt", "-n", "2"], "hi\n")
    assert code == 0, err
    assert BLOCK.findall(err)[0][1] == "user: hi\nassistant:"
    code, _, err = in_process(monkeypatch, capsys, ["-m", str(bare), "--chat-template",
                                                    str(tmp_path / "nope.jinja")], "")
    assert code == 2 and "--chat-template: " in err and "does not exist" in err


def test_unknown_commands_and_bad_flags(model, monkeypatch, capsys):
    code, out, err = in_process(monkeypatch, capsys, ["-m", str(model), "-n", "1"], "/help\n")
    assert code == 0 and "unknown command /help: /reset clears the history" in err and out == ""
    with pytest.raises(SystemExit) as info:
        in_process(monkeypatch, capsys, ["-m", str(model), "--top-p", "2"], "")
    assert info.value.code == 2 and "--top-p" in capsys.readouterr().err
