"""``inferno chat``: an interactive chat in the terminal with a model that has a chat template.

    inferno chat -m smollm2-135m-instruct
    inferno chat -m qwen2.5-0.5b-instruct --system "You answer in one sentence." --preset sample
    printf 'Hi!\\nAnd again?\\n' | inferno chat -m ./my-model      # one reply a line of stdin

Each line you type is a user message; the whole conversation so far (the `--system` message, then every
turn) is rendered with the model's own chat template (its tokenizer_config.json or chat_template.jinja,
or ``--chat-template FILE``, as `inferno serve` takes it) and the reply streams as it is generated.
On a terminal the prompt has line editing and the up arrow recalls earlier lines (readline, where Python
has it). ``/reset`` clears the history, ``/exit`` (or Ctrl-D) quits; Ctrl-C stops a reply, and at the prompt
quits. A model without a chat template (GPT-2) is refused (exit 2) unless ``--chat-template`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Sequence
from typing import Any

from inferno.cli._args import (
    EXIT_INTERRUPTED,
    CliError,
    Number,
    Parser,
    add_model_args,
    bias,
    check_utf8,
    load,
    non_negative,
    seed,
    temperature,
    top_p,
    unescape,
)

COMMANDS = "/reset clears the history, /exit or Ctrl-D quits"


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="inferno chat", description="Chat with a model in the terminal, with its own chat "
               f"template; {COMMANDS}. Reads one message a line from stdin when it is not a terminal.")
    add_model_args(p)
    arg = p.add_argument
    arg("--system", metavar="TEXT", help="a system message before the conversation")
    arg("--chat-template", metavar="FILE", help="a Jinja2 chat template in Hugging Face's format, or a "
        "tokenizer_config.json holding one (default: the model's own)")
    arg("-n", "--max-new-tokens", metavar="N", type=non_negative, default=512,
        help="tokens a reply may have at most (512)")
    arg("-t", "--temperature", metavar="T", type=temperature,
        help="0 = greedy (default); higher = more random")
    arg("--top-k", metavar="K", type=non_negative, help="sample from the k most likely tokens (0 = off)")
    arg("--top-p", metavar="P", type=top_p, help="nucleus sampling mass in (0, 1] (1 = off)")
    arg("-s", "--seed", metavar="S", type=seed, help="random seed: the same seed gives the same replies")
    arg("--preset", choices=["greedy", "sample"], help="sample = temperature 0.8 + top-k 40; explicit flags "
        "override it")
    arg("--stop", metavar="S", action="append", type=unescape,
        help="end a reply before this text (repeatable; \\n, \\t, \\\\ are read as escapes)")
    finite = Number(float, math.isfinite, "a number")
    arg("--repetition-penalty", metavar="R", type=finite, help="> 1 repeats less; 1 = off")
    arg("--presence-penalty", metavar="P", type=finite, help="in [-2, 2]; 0 = off")
    arg("--frequency-penalty", metavar="F", type=finite, help="in [-2, 2]; 0 = off")
    arg("--logit-bias", metavar="ID=BIAS", action="append", type=bias,
        help="add BIAS in [-100, 100] to token ID's logit (repeatable; -100 bans it)")
    arg("--show-prompt", action="store_true",
        help="print each rendered prompt (the template's text the model continues) on stderr")
    return p


def _options(args: argparse.Namespace, eos_ids: Sequence[int]):
    """The generation options of the flags (a bad value: a CliError naming the flag); a reply also ends
    at any of the tokenizer's EOS ids (Llama 3 Instruct lists two)."""
    from inferno.options import GenerationOptions, OptionError
    from inferno.sampling import PRESETS

    chosen = dict(PRESETS[args.preset or "greedy"])
    for name in ("temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        if getattr(args, name) is not None:
            chosen[name] = getattr(args, name)
    try:
        return GenerationOptions(**chosen, seed=args.seed, stop=tuple(args.stop or ()),
                                 stop_ids=tuple(eos_ids), logit_bias=dict(args.logit_bias or ()))
    except OptionError as exc:
        flag = "--" + exc.field.split("[")[0].replace("_", "-")
        raise CliError(f"{flag}: {exc.reason.replace(' (or None)', '')}") from None


def _template(args: argparse.Namespace, pipe: Any):
    """The chat template: --chat-template FILE, else the model's own; none is a CliError (exit 2)."""
    from inferno.chat_template import ChatTemplateError, load_chat_template, model_template

    source = None
    if args.chat_template is not None:
        try:
            source = load_chat_template(args.chat_template)
        except ChatTemplateError as exc:
            raise CliError(f"--chat-template: {exc}") from None
    try:
        template = model_template(pipe.tokenizer, source, eos_token_id=pipe.config.eos_token_id)
    except ChatTemplateError as exc:
        raise CliError(str(exc)) from None
    if template is None:
        raise CliError(f"model {args.model_dir or 'gpt2'} has no chat template (no chat_template in its "
                       "tokenizer_config.json, no chat_template.jinja): chat with an instruct model "
                       "(-m smollm2-135m-instruct), or give one with --chat-template FILE")
    return template


class Chat:
    """The conversation: the system message, the turns so far, and how to answer the next one."""

    def __init__(self, pipe: Any, template: Any, options: Any, max_new_tokens: int, system: str | None,
                 show_prompt: bool = False) -> None:
        self.pipe, self.template, self.options = pipe, template, options
        self.max_new_tokens, self.system, self.show_prompt = max_new_tokens, system, show_prompt
        self.history: list[dict[str, str]] = []

    def messages(self, user: str) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, *self.history, {"role": "user", "content": user}]

    def reply(self, user: str) -> None:
        """Answer one user message, streaming the reply to stdout; the turn joins the history (a reply
        cut short by Ctrl-C too, as far as it went). A conversation past the context is said on stderr
        and left out of the history."""
        from inferno.chat_template import ChatTemplateError

        try:
            prompt = self.template.render(self.messages(user), add_generation_prompt=True)
        except ChatTemplateError as exc:
            print(f"inferno chat: the chat template refused this conversation: {exc}", file=sys.stderr)
            return
        ids = self.pipe.tokenizer.encode(prompt, allow_special=True)
        context = self.pipe.config.n_positions
        if self.show_prompt:
            print(f"--- prompt ({len(ids)} tokens) ---\n{prompt}\n--- end of prompt ---", file=sys.stderr)
        if len(ids) >= context:
            print(f"inferno chat: the conversation is {len(ids)} tokens, more than the model's context of "
                  f"{context}: /reset to start again (this message was not sent)", file=sys.stderr)
            return
        stream = self.pipe.tokens(ids, min(self.max_new_tokens, context - len(ids)), stop_at_eos=True,
                                  options=self.options)
        text = []
        try:
            for step in stream.steps():
                text.append(step.text)
                sys.stdout.write(step.text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            text.append(stream.state.finish("interrupted"))
            sys.stdout.write(text[-1])
            print("\n[interrupted]", file=sys.stderr, end="")
        sys.stdout.write("\n")
        sys.stdout.flush()
        self.history += [{"role": "user", "content": user}, {"role": "assistant", "content": "".join(text)}]


def _lines(interactive: bool):
    """The user's lines: read with a prompt (and line editing) on a terminal, else from stdin as they come."""
    while True:
        if interactive:
            try:
                line = input(">>> ")
            except EOFError:
                print(file=sys.stderr)
                return
        else:
            line = sys.stdin.readline()
            if not line:
                return
            line = line.removesuffix("\n").removesuffix("\r")
        yield line


def run(argv: Sequence[str]) -> int:
    """Entry point of ``inferno chat`` (`argv`: the arguments after ``chat``). Returns the exit code."""
    args = _parser().parse_args(list(argv))
    if args.system is not None:
        args.system = check_utf8(args.system, "--system")
    if hasattr(sys.stdout, "reconfigure"):  # never die on a terminal that cannot encode a reply
        sys.stdout.reconfigure(errors="replace")
    pipe = load(args)
    template = _template(args, pipe)
    eos = pipe.eos_ids
    chat = Chat(pipe, template, _options(args, eos), args.max_new_tokens, args.system, args.show_prompt)
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):  # line editing and the up arrow's history for input()
            import readline  # noqa: F401
        print(f"inferno chat: {args.model_dir or 'gpt2'} on {pipe.backend.name}; {COMMANDS}", file=sys.stderr)
    try:
        for line in _lines(interactive):
            command = line.strip()
            if command in ("/exit", "/quit"):
                break
            if command == "/reset":
                chat.history.clear()
                print("inferno chat: history cleared", file=sys.stderr)
                continue
            if command.startswith("/") and " " not in command:
                print(f"inferno chat: unknown command {command}: {COMMANDS}", file=sys.stderr)
                continue
            if not command:
                continue
            chat.reply(check_utf8(line, "the message"))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
