"""`inferno chat` (#41): messages piped on stdin, each rendered with the model's own chat template over the
whole history (checked against the template rendered here, with the replies generation gives), /reset,
/exit, --system, --chat-template FILE, and exit 2 for a model without a template; and on a pseudo-terminal,
the prompt, readline's history and Ctrl-D."""

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


def test_on_a_terminal_replies_stream_the_up_arrow_recalls_and_ctrl_d_quits(model):
    # A real pseudo-terminal, as a user's shell gives it: the banner and the ">>> " prompt, readline's
    # history (the up arrow sends the last line again), /reset, and Ctrl-D at the prompt ends with exit 0.
    pty = pytest.importorskip("pty")
    import select
    import time

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONIOENCODING": "utf-8", "TERM": "xterm"}
    env.pop("INFERNO_BACKEND", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: inferno chat on the terminal's other side
        os.execve(sys.executable, [sys.executable, "-m", "inferno", "chat", "-m", str(model), "-n", "4",
                                   "--show-prompt"], env)
    seen = bytearray()

    def until(text: str, count: int = 1, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while seen.decode("utf-8", "replace").count(text) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} (x{count}) in {seen.decode('utf-8', 'replace')!r}"
            if select.select([fd], [], [], left)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child has gone
                    chunk = b""
                assert chunk, f"the chat ended early: {seen.decode('utf-8', 'replace')!r}"
                seen.extend(chunk)
        return seen.decode("utf-8", "replace").replace("\r\n", "\n")

    try:
        until(">>> ")
        assert "inferno chat: " in until(">>> ") and "/reset clears the history" in until(">>> ")
        os.write(fd, b"Hello there\r")
        until(">>> ", 2)
        os.write(fd, b"\x1b[A\r")  # the up arrow: the same line again
        out = until(">>> ", 3)
        prompts = [text for _, text in BLOCK.findall(out)]
        assert len(prompts) == 2, out
        assert prompts[1].count("Hello there") == 2 and prompts[0].count("Hello there") == 1
        os.write(fd, b"/reset\r")
        assert "history cleared" in until(">>> ", 4)
        os.write(fd, b"\x04")  # Ctrl-D at the prompt
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, "Ctrl-D did not end the chat"
            with_output = select.select([fd], [], [], 0.2)[0]
            if with_output:
                try:
                    os.read(fd, 4096)
                except OSError:
                    pass
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
