"""What every subcommand shares (inferno/cli/_args.py), in this process: the number types and their
messages, --stop's escapes, --logit-bias's ID=BIAS, --threads, reading a text, the --ray flags and what
`run_ray_job` hands to the Ray job (with a stand-in for it: Ray is an extra), and the exit codes."""

from __future__ import annotations

import argparse
import io
import sys
import types
from dataclasses import dataclass

import pytest
from cli_helpers import FakeStdin

from inferno.cli import _args
from inferno.cli._args import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    Parser,
    add_model_args,
    add_ray_args,
    bias,
    count,
    decode_text,
    exit_code,
    non_negative,
    positive,
    read_stdin,
    read_text,
    run_ray_job,
    seed,
    temperature,
    top_p,
    unescape,
    user_errors,
    without_ray,
)
from inferno.jobs.progress import JobReport


def _refused(parse, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse(text)
    return str(info.value)


def test_exit_codes():
    assert (EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED) == (1, 2, 130)


@pytest.mark.parametrize("parse, good, bad, expected", [
    (temperature, {"0": 0.0, "1.5": 1.5}, ["-0.1", "inf", "nan", "x"], "a finite number >= 0"),
    (top_p, {"1": 1.0, "0.5": 0.5}, ["0", "1.01", "-1", "x"], "a number in (0, 1]"),
    (non_negative, {"0": 0, "7": 7}, ["-1", "1.5", "x"], "an integer >= 0"),
    (positive, {"1": 1, "7": 7}, ["0", "-1", "x"], "an integer >= 1"),
    (seed, {"0": 0, "42": 42}, ["-1", "x"], "an integer >= 0"),
    (_args._positive_float, {"0.5": 0.5, "2": 2.0}, ["0", "-1", "inf", "nan", "x"], "a number > 0"),
])
def test_each_number_type_takes_its_range_and_names_it_when_refusing(parse, good, bad, expected):
    for text, value in good.items():
        assert parse(text) == value and type(parse(text)) is type(value)
    for text in bad:
        assert _refused(parse, text) == f"expected {expected}, got {text!r}"


def test_a_parser_error_is_one_line_with_exit_2(capsys):
    p = Parser(prog="inferno x")
    p.add_argument("--n", type=positive)
    with pytest.raises(SystemExit) as info:
        p.parse_args(["--n", "0"])
    assert info.value.code == EXIT_USAGE
    assert capsys.readouterr().err == ("inferno x: error: argument --n: expected an integer >= 1, got '0' "
                                       "(see inferno x --help)\n")


def test_stop_strings_unescape_as_llama_cpp_reads_them():
    assert unescape(r"a\nb\tc\rd\\e\"f\'g") == "a\nb\tc\rd\\e\"f'g"
    assert unescape(r"\q stays, \\n is a backslash and n") == "\\q stays, \\n is a backslash and n"


def test_logit_bias_is_id_equals_bias():
    assert bias("50256=-100") == (50256, -100.0)
    assert bias("7=1.5") == (7, 1.5)
    for text in ("50256", "x=1", "1=x", "=1"):
        assert _refused(bias, text) == f"expected ID=BIAS (e.g. 50256=-100), got {text!r}"
    assert bias.__name__ == "ID=BIAS"


def test_model_flags():
    p = argparse.ArgumentParser()
    add_model_args(p)
    args = p.parse_args(["-m", "random", "-b", "numpy", "--threads", "2"])
    assert (args.model_dir, args.backend, args.threads) == ("random", "numpy", 2)
    assert p.parse_args(["--model-dir", "d"]).model_dir == "d"
    args = p.parse_args([])
    assert (args.model_dir, args.backend, args.threads) == (None, None, None)


def _flags(add) -> dict[str, tuple[list[str], str | None, str | None]]:
    """Each flag `add` adds: its option strings, metavar and help (--help's text, in any Python)."""
    p = argparse.ArgumentParser(prog="x", add_help=False)
    add(p)
    return {a.dest: (a.option_strings, a.metavar, a.help) for a in p._actions}


def test_the_model_flags_help():
    assert _flags(add_model_args) == {
        "model_dir": (["-m", "--model", "--model-dir"], "NAME",
                      "a folder, a Hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2, or "
                      "ORG/NAME[@REVISION] of a GPT-2 or Llama-family model, as "
                      "HuggingFaceTB/SmolLM2-135M-Instruct) or random / random:tiny (default: gpt2 from the "
                      "Hugging Face cache; see docs/models.md)"),
        "backend": (["-b", "--backend"], "NAME", "compute backend, optionally with options: "
                    "NAME[:key=value,...] (default: $INFERNO_BACKEND or numpy; see 'inferno backends')"),
        "threads": (["--threads"], "N", "worker threads (cpu-threaded, torch, half; default: usable cores); "
                    "other backends reject it"),
    }


def test_the_ray_flags_help():
    assert _flags(add_ray_args) == {
        "ray": (["--ray"], "ADDRESS", "run on Ray Data (needs the ray extra): without ADDRESS, ray.init()'s "
                "default (RAY_ADDRESS, a Ray started on this machine, else a new local one); 'auto', "
                "HOST:PORT or ray://HOST:PORT for a cluster"),
        "workers": (["--workers"], "N", "with --ray: Ray actors, each loading the model once (default 1)"),
        "cpus_per_worker": (["--cpus-per-worker"], "N", "with --ray: CPUs Ray reserves for each worker, "
                            "which are its BLAS threads (default 1)"),
    }


def test_threads_on_a_backend_without_threads_names_the_flag():
    with pytest.raises(CliError) as info:
        _args.load(argparse.Namespace(model_dir="random:tiny", backend="numpy", threads=2))
    assert str(info.value).startswith("--threads: ") and "numpy" in str(info.value)
    pipe = _args.load(argparse.Namespace(model_dir="random:tiny", backend="cpu-threaded", threads=3))
    assert (pipe.backend.name, pipe.backend.threads) == ("cpu-threaded", 3)
    assert _args.load(argparse.Namespace(model_dir="random:tiny", backend=None, threads=None)).config.n_layer


def test_count():
    assert (count(1, "request"), count(0, "request"), count(2, "text")) == ("1 request", "0 requests",
                                                                             "2 texts")


def test_stdin_is_read_up_to_its_limit(monkeypatch):
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"12345678"))
    assert read_stdin(8) == b"12345678"
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"123456789"))
    with pytest.raises(CliError) as info:
        read_stdin(8, "a prompt")
    assert str(info.value) == "stdin: more than the 8-byte limit for a prompt"
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"123456789"))
    with pytest.raises(CliError) as info:
        read_stdin(8)
    assert str(info.value) == "stdin: more than the 8-byte limit for a text"
    assert _args.MAX_TEXT_BYTES == 64 << 20


def test_an_endless_stdin_is_read_only_past_the_limit(monkeypatch):
    monkeypatch.setattr(sys, "stdin", FakeStdin(None))
    with pytest.raises(CliError) as info:
        read_stdin(8)
    assert str(info.value) == "stdin: more than the 8-byte limit for a text"


def test_a_text_file_past_the_limit_is_refused_naming_it(tmp_path, monkeypatch):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 9)
    monkeypatch.setattr(_args, "MAX_TEXT_BYTES", 8)
    with pytest.raises(CliError) as info:
        read_text(str(big), "--prompt-file")
    assert str(info.value) == f"--prompt-file {big}: is 9 bytes, more than the 8-byte limit for a text"


def test_read_text_from_a_file_or_stdin(tmp_path, monkeypatch):
    f = tmp_path / "t.txt"
    f.write_bytes("\ufeffhé".encode())
    assert read_text(str(f)) == "hé"  # the byte-order mark is not part of the text
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"ok\n"))
    assert read_text("-") == "ok\n"
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"\xff"))
    with pytest.raises(CliError) as info:
        read_text("-")
    assert str(info.value) == "stdin: not UTF-8 text (byte 0xff at offset 0)"
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"", tty=True))
    with pytest.raises(CliError) as info:
        read_text("-")
    assert str(info.value) == "give a FILE to score, or pipe the text in: inferno score - < FILE"
    missing = tmp_path / "none.txt"
    with pytest.raises(CliError) as info:
        read_text(str(missing), "--prompt-file")
    assert str(info.value) == f"--prompt-file {missing}: No such file or directory"
    with pytest.raises(CliError) as info:
        read_text(str(missing))
    assert str(info.value) == f"{missing}: No such file or directory"


def test_decode_text():
    assert decode_text("\ufeffa\ufeff".encode(), "f") == "a\ufeff"  # only a leading one is dropped
    with pytest.raises(CliError) as info:
        decode_text(b"ab\xc3", "f.txt")
    assert str(info.value) == "f.txt: not UTF-8 text (byte 0xc3 at offset 2)"


def test_user_errors_are_the_ones_a_user_can_fix():
    from inferno.backends.registry import BackendOptionError, BackendUnavailableError, UnknownBackendError
    from inferno.generate import GenerationError
    from inferno.jobs import JobError
    from inferno.models.config import ConfigError
    from inferno.models.resolve import ModelFilesMissing
    from inferno.models.weights import WeightsError
    from inferno.sampling import SamplingError
    from inferno.scoring import ScoringError
    from inferno.tokenizer import TokenizerError

    assert set(user_errors()) == {CliError, JobError, ConfigError, WeightsError, TokenizerError,
                                  ModelFilesMissing, UnknownBackendError, BackendUnavailableError,
                                  BackendOptionError, GenerationError, SamplingError, ScoringError, OSError}


# ------------------------------------------------------------------------------------- --ray


def _ray_parser() -> argparse.ArgumentParser:
    p = Parser(prog="inferno batch")
    p.add_argument("input")
    p.add_argument("--strict", action="store_true")
    add_ray_args(p)
    return p


@pytest.mark.parametrize("given, address", [
    ([], None), (["--ray"], ""), (["--ray=auto"], "auto"), (["--ray=local"], "local"),
    (["--ray", "ray://h:10001"], "ray://h:10001"), (["--ray", "ray://head"], "ray://head"),
    (["--ray", "10.0.0.1:6379"], "10.0.0.1:6379"), (["--ray", "[::1]:6379"], "[::1]:6379"),
])
def test_ray_addresses(given, address):
    assert _ray_parser().parse_args(["in.jsonl", *given]).ray == address


@pytest.mark.parametrize("text", ["in.jsonl", "host:", ":6379", "host:port", "x"])
def test_a_ray_address_that_is_not_one_is_refused(text, capsys):
    with pytest.raises(SystemExit):
        _ray_parser().parse_args(["--ray", text, "in.jsonl"])
    assert (f"argument --ray: expected auto, HOST:PORT or ray://HOST:PORT, got {text!r} (write --ray "
            "after IN, or --ray=ADDRESS)") in capsys.readouterr().err


def test_ray_flags_and_the_first_one_given_without_ray():
    p = _ray_parser()
    args = p.parse_args(["in.jsonl", "--ray", "--workers", "3", "--cpus-per-worker", "0.5"])
    assert (args.workers, args.cpus_per_worker) == (3, 0.5)
    assert without_ray(args) is None
    assert without_ray(p.parse_args(["in.jsonl"])) is None
    assert without_ray(p.parse_args(["in.jsonl", "--workers", "2"])) == "--workers"
    assert without_ray(p.parse_args(["in.jsonl", "--cpus-per-worker", "2"])) == "--cpus-per-worker"
    args = p.parse_args(["in.jsonl", "--strict"])
    assert without_ray(args) is None  # --strict works without Ray
    assert without_ray(args, ("strict",)) == "--strict"  # unless the command says it only works with it
    args.strict = False
    assert without_ray(args, ("strict",)) is None
    # a namespace without some of the flags (a command that has not got them) has none of them given
    assert without_ray(argparse.Namespace()) is None
    assert without_ray(argparse.Namespace(workers=2)) == "--workers"


@dataclass
class _Config:
    kind: str
    model_dir: str | None
    backend: str | None
    threads: int | None
    workers: int
    cpus_per_worker: float
    prefill_chunk: int
    max_new_tokens: int
    stop_at_eos: bool
    stride: int | None
    strict: bool
    slots: int


@pytest.fixture
def ray_job(monkeypatch):
    """A stand-in for inferno.integrations.ray_batch: what `run_ray_job` gives it, and the report it
    hands back."""
    import inferno.integrations

    calls: list = []
    fake = types.ModuleType("inferno.integrations.ray_batch")
    fake.GENERATE = "generate"
    fake.JobConfig = _Config
    fake.report = JobReport(todo=3, written=3, tokens=9, seconds=1.0)

    def run_job(config, input_name, output_name, address, say):
        calls.append((config, input_name, output_name, address))
        say("a note")
        return fake.report

    fake.run_job = run_job
    fake.calls = calls
    monkeypatch.setitem(sys.modules, "inferno.integrations.ray_batch", fake)
    monkeypatch.setattr(inferno.integrations, "ray_missing", lambda part="data": None)
    return fake


def _namespace(**given) -> argparse.Namespace:
    base = dict(model_dir="m", backend="numpy", threads=None, workers=None, cpus_per_worker=None,
                strict=False, ray="", input="in.jsonl", output="out.jsonl")
    return argparse.Namespace(**{**base, **given})


class _Stderr(io.StringIO):
    """Records what was written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_run_ray_job_says_each_note_at_once_and_an_interruption_as_its_count(ray_job, monkeypatch):
    err = _Stderr()
    monkeypatch.setattr(sys, "stderr", err)
    ray_job.report = JobReport(todo=3, written=1, interrupted=True)
    assert run_ray_job("score", _namespace(), "inferno score") == EXIT_INTERRUPTED
    assert "inferno score: a note\n" in err.flushed  # flushed as it is said, not when the job ends
    # Ray's workers do not know the whole job's count: N written, not N of M
    assert err.getvalue().splitlines()[-1] == "[interrupted: 1 texts written to out.jsonl]"


def test_run_ray_job_hands_the_flags_and_their_defaults_to_the_job(ray_job, capsys):
    code = run_ray_job("generate", _namespace(), "inferno batch")
    config, input_name, output_name, address = ray_job.calls[0]
    assert (input_name, output_name, address, code) == ("in.jsonl", "out.jsonl", None, 0)
    assert config == _Config(kind="generate", model_dir="m", backend="numpy", threads=None, workers=1,
                             cpus_per_worker=1.0, prefill_chunk=64, max_new_tokens=50, stop_at_eos=True,
                             stride=None, strict=False, slots=16)
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "inferno batch: a note"
    assert err.splitlines()[-1] == ray_job.report.summary("requests", "new tokens", "out.jsonl",
                                                           of_todo=False)


def test_run_ray_job_with_every_flag_given(ray_job, capsys):
    args = _namespace(threads=2, workers=3, cpus_per_worker=0.5, strict=True, ray="auto", prefill_chunk=8,
                      max_new_tokens=5, ignore_eos=True, stride=4, slots=2)
    ray_job.report = JobReport(todo=2, written=1, failed=1)
    assert run_ray_job("score", args, "inferno score") == EXIT_FAILED
    config, _, _, address = ray_job.calls[0]
    assert address == "auto"
    assert config == _Config(kind="score", model_dir="m", backend="numpy", threads=2, workers=3,
                             cpus_per_worker=0.5, prefill_chunk=8, max_new_tokens=5, stop_at_eos=False,
                             stride=4, strict=True, slots=2)
    assert capsys.readouterr().err.splitlines()[-1] == ray_job.report.summary("texts", "tokens", "out.jsonl",
                                                                              of_todo=False)
    run_ray_job("score", _namespace(ray="local"), "inferno score")
    assert ray_job.calls[-1][3] == "local"


def test_run_ray_job_without_ray_says_what_to_install(monkeypatch):
    import inferno.integrations

    monkeypatch.setattr(inferno.integrations, "ray_missing", lambda part="data": f"needs Ray ({part})")
    with pytest.raises(CliError) as info:
        run_ray_job("generate", _namespace(), "inferno batch")
    assert str(info.value) == "--ray needs Ray (data)"


def test_a_jobs_exit_code():
    assert exit_code(JobReport()) == 0
    assert exit_code(JobReport(failed=1)) == EXIT_FAILED
    assert exit_code(JobReport(failed=1, interrupted=True)) == EXIT_INTERRUPTED
