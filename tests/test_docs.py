"""The README and docs/ stay true: their links resolve, their snippets run and say what they print, every
flag of every subcommand is documented, the README's speed table is the one in docs/benchmarks.md, and
install commands name the `inferno-gpt2` distributions."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import sys
from pathlib import Path

import pytest

import inferno

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted([README, *DOCS.glob("*.md")])

def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def section(page: str, heading: str) -> str:
    """The text under `heading` (a whole '## ...' or '### ...' line) up to the next heading of its level
    or above."""
    level = heading.split()[0]
    start = page.index(f"\n{heading}\n")
    rest = page[start + len(heading) + 2:]
    end = re.search(rf"^#{{1,{len(level)}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def code_blocks(page: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", page, re.S)


# ------------------------------------------------------------------------------------------- README


def test_readme_fits_on_a_page():
    lines = text(README).splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("marker", ["main-command", "test-command"])
def test_readme_keeps_its_marked_commands(marker):
    # CI (.ci/run, tests/test_project.py) and the harness read these blocks: one sh line each.
    match = re.search(rf"<!-- {marker} -->\n```sh\n(.+?)\n```", text(README))
    assert match, f"README.md has no ```sh block right after <!-- {marker} -->"
    command = match.group(1)
    assert "\n" not in command and command.startswith("python3 -m venv .venv && . .venv/bin/activate && ")


def test_readme_links_every_task_to_its_page():
    tasks = section(text(README), "## What you can do")
    for page in ("cli.md", "python-api.md", "batch-jobs.md", "serving.md", "ray.md", "backends.md",
                 "plugins.md", "benchmarks.md"):
        assert f"(docs/{page}" in tasks, page


def _headline_rows(page: str, heading: str) -> dict[str, list[str]]:
    """{first backticked name: the row's cells} of the tables under `heading`."""
    rows = {}
    for line in section(page, heading).splitlines():
        name = re.match(r"\| `([^`]+)`", line)
        if name:
            rows[name.group(1)] = [c.strip() for c in line.strip("|").split("|")]
    return rows


def test_readme_speed_table_is_the_benchmarks_one():
    readme, bench = text(README), text(DOCS / "benchmarks.md")
    heading = "## Batch-1 decode with 16-bit weights"
    command = "python benches/sixteen_bit.py --rounds 9 --steps 32"
    assert command in section(readme, "## Speed") and command in section(bench, heading)
    ours, theirs = _headline_rows(readme, "## Speed"), _headline_rows(bench, heading)
    assert len(ours) >= 3
    for name, cells in ours.items():
        assert name in theirs, f"README's speed table has {name!r}, docs/benchmarks.md's does not"
        figures = [c for c in cells[1:] if re.fullmatch(r"[\d.]+", c)]
        assert figures and all(f in theirs[name] for f in figures), (name, figures, theirs[name])
    dates = [re.findall(r"20\d\d-\d\d-\d\d", section(page, h))[:1] for page, h in ((readme, "## Speed"),
                                                                                   (bench, heading))]
    assert dates[0] and dates[0] == dates[1], f"the two tables' dates differ: {dates}"


# ------------------------------------------------------------------------------------ links, anchors


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: str) -> set[str]:
    body = re.sub(r"```.*?```", "", page, flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", body, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page):
    body = re.sub(r"```.*?```", "", text(page), flags=re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"[a-z]+:", target):
            continue  # https://, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(text(dest)):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not bad, f"{page.name}: " + "; ".join(bad)


def test_the_index_lists_every_page():
    index = text(DOCS / "README.md")
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"


# --------------------------------------------------------------------- install names (issue 26)

_OLD_EXTRA = re.compile(r"""pip install (-e )?["']?inferno\[""")
_BARE_INFERNO = re.compile(r"""pip install (-U )?["']?inferno(["'\s]|$)""", re.M)
_OLD_PLUGIN = re.compile(r"(?<![\w/.-])inferno-(torch|half)\b")
_OLD_REQUIREMENT = re.compile(r"""["']inferno(\[[^\]]*\])?\s*(>=|==|~=|<)""")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_install_commands_name_the_gpt2_distributions(page):
    # On PyPI `inferno` is someone else's project: the distributions are inferno-gpt2, inferno-gpt2-half,
    # inferno-gpt2-torch (the folders stay plugins/inferno-gpt2-half, plugins/inferno-gpt2-torch).
    for n, line in enumerate(text(page).splitlines(), 1):
        where = f"{page.name}:{n}: {line.strip()}"
        assert not _OLD_EXTRA.search(line), f"{where}: say pip install \"inferno-gpt2[...]\""
        assert not _BARE_INFERNO.search(line), f"{where}: the distribution is inferno-gpt2"
        assert not _OLD_PLUGIN.search(line), f"{where}: the plugins are inferno-gpt2-torch, inferno-gpt2-half"
        assert not _OLD_REQUIREMENT.search(line), f"{where}: depend on inferno-gpt2"


def test_the_install_check_catches_the_old_names():
    for bad in ('pip install "inferno[serve]"', "pip install inferno[ray]", "pip install inferno",
                "pip uninstall inferno-torch", "inferno-half 0.1.0", 'dependencies = ["inferno>=0.1"]'):
        assert (_OLD_EXTRA.search(bad) or _BARE_INFERNO.search(bad) or _OLD_PLUGIN.search(bad)
                or _OLD_REQUIREMENT.search(bad)), bad
    for good in ('pip install "inferno-gpt2[serve]"', "pip install -e plugins/inferno-gpt2-torch",
                 "pip install inferno-gpt2-half", 'dependencies = ["inferno-gpt2>=0.1"]'):
        assert not (_OLD_EXTRA.search(good) or _BARE_INFERNO.search(good) or _OLD_PLUGIN.search(good)
                    or _OLD_REQUIREMENT.search(good)), good


# --------------------------------------------------------------------------------- docs/cli.md


def _help(argv: list[str]) -> str:
    from inferno.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


#: Where docs/cli.md documents each subcommand's own flags; the model and backend flags every subcommand
#: shares are documented once, under generating.
CLI_SECTIONS = {"": "## Generating: `inferno [PROMPT]`", "score": "## `inferno score`",
                "batch": "## `inferno batch`", "serve": "## `inferno serve`",
                "backends": "## `inferno backends`", "bench": "## `inferno bench`",
                "inspect": "## `inferno inspect`", "chat": "## `inferno chat`"}
SHARED_FLAGS = {"-m", "--model", "--model-dir", "-b", "--backend", "--threads"}


@pytest.mark.parametrize("subcommand", sorted(CLI_SECTIONS))
def test_every_flag_is_in_the_cli_page(subcommand):
    if subcommand == "serve":
        pytest.importorskip("fastapi")
    usage = _help([subcommand] if subcommand else [])
    # argparse's option lines: "  -n N, --max-new-tokens N   help text" (not the prose of the epilog).
    heads = re.findall(r"^  (-[^ ].*?)(?:  |$)", usage.split("\noptions:")[-1], re.M)
    flags = {f for h in heads for f in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", h)} - {"-h", "--help"}
    assert flags, usage
    page = text(DOCS / "cli.md")
    own, shared = section(page, CLI_SECTIONS[subcommand]), section(page, CLI_SECTIONS[""])
    missing = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])",
                                                        shared if f in SHARED_FLAGS else own))
    assert not missing, (f"inferno {subcommand} --help has flags that docs/cli.md's section "
                         f"{CLI_SECTIONS[subcommand]!r} does not mention: {missing}")


def test_cli_synopsis_and_short_flags():
    synopsis = code_blocks(text(DOCS / "cli.md"), "")[0]
    for flag in ("--version", "-f FILE", "-n N", "-m MODEL", "-t T", "-s S", "-b NAME", "-j",
                 "inferno score", "inferno batch", "inferno serve", "inferno backends", "inferno bench",
                 "inferno inspect"):
        assert flag in synopsis, flag


def test_cli_page_gives_the_fetch_command_inferno_prints(tmp_path, monkeypatch, capsys):
    # No model in the cache and a download that fails: inferno's second line is the `hf download`
    # command, as the page says.
    from inferno.cli import main

    monkeypatch.chdir(tmp_path)
    for name in ("HF_HUB_OFFLINE", "INFERNO_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        assert main(["Hello", "-n", "1"]) == 2
    printed = re.search(r"hf download [^;\n]+", capsys.readouterr().err)
    assert printed, "inferno did not suggest an hf download command (is huggingface_hub installed?)"
    page = text(DOCS / "cli.md")
    assert printed.group(0) in page


# ------------------------------------------------------------------------------ runnable snippets


def _check_commented_values(block: str, namespace: dict, source: str) -> int:
    """Run `block` statement by statement; where a statement is an expression whose line ends in a
    comment that starts with a Python literal (``tok.decode(ids)  # 'Hello'``), its value must be that.
    Returns how many values were checked."""
    lines, checked = block.splitlines(), 0
    for stmt in ast.parse(block).body:
        code = compile(ast.Module([stmt], []), source, "exec")
        if isinstance(stmt, ast.Expr) and stmt.end_lineno == stmt.lineno:
            comment = lines[stmt.lineno - 1][stmt.end_col_offset:].strip()
            said = _literal(comment[1:].split(";")[0].strip()) if comment.startswith("#") else None
            if said is not None:
                value = eval(compile(ast.Expression(stmt.value), source, "eval"), namespace)
                assert value == said[0], (
                    f"{source}: {ast.unparse(stmt)} is {value!r}, the doc says {said[0]!r}")
                checked += 1
                continue
        exec(code, namespace)
    return checked


def _literal(s: str) -> tuple | None:
    try:
        return (ast.literal_eval(s),)
    except (ValueError, SyntaxError):
        return None


@pytest.fixture
def load_test_model(monkeypatch, model_dir):
    """`inferno.load()` in a snippet loads the test model (GPT-2's vocabulary, 2 layers, 128 positions)."""
    real = inferno.load

    def load(model=None, backend=None, **kwargs):
        return real(model_dir, backend, download=False)

    monkeypatch.setattr(inferno, "load", load)


def test_readme_python_example_runs(load_test_model, capsys):
    (block,) = code_blocks(text(README), "python")
    assert len(block.strip().splitlines()) <= 5
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and float(out[1]) > 1  # the text, then a perplexity


def test_python_api_snippets_run(load_test_model, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # the snippets work from any folder, not only the checkout's root
    namespace: dict = {}
    blocks = code_blocks(text(DOCS / "python-api.md"), "python")
    assert len(blocks) >= 5
    checked = sum(_check_commented_values(b, namespace, "docs/python-api.md") for b in blocks)
    assert checked >= 4  # the tokenizer's encode/decode lines at least


def test_the_tokenizer_snippet_runs_alone(monkeypatch, tmp_path):
    page = text(DOCS / "python-api.md")
    block = re.search(r"## The tokenizer\n.*?```python\n(.+?)```", page, re.S).group(1)
    assert block.startswith("import inferno\n")
    monkeypatch.chdir(tmp_path)  # not the checkout's root: the file is found through the package
    assert _check_commented_values(block, {}, "docs/python-api.md") == 4


def test_the_backend_example_generates_numpys_tokens(model_dir):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    page = text(DOCS / "backends.md")
    toml = tomllib.loads(code_blocks(page, "toml")[0])
    ours = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]
    groups = set(ours["entry-points"])
    assert set(toml["project"]["entry-points"]) <= groups  # the group inferno reads: inferno.backends
    assert all(dep.startswith(ours["name"]) for dep in toml["project"]["dependencies"]), (
        f"the example depends on {toml['project']['dependencies']}; the distribution is {ours['name']!r}")
    module = code_blocks(page, "python")[0]
    namespace: dict = {"__name__": "inferno_mybackend"}
    exec(compile(module, "docs/backends.md", "exec"), namespace)
    mine = inferno.load(model_dir, namespace["MyBackend"](), download=False)
    reference = inferno.load(model_dir, "numpy", download=False)
    kwargs = dict(max_new_tokens=8, stop_at_eos=False)
    assert mine.generate("The quick brown fox", **kwargs).ids == reference.generate(
        "The quick brown fox", **kwargs).ids
    registered = []
    namespace["register_backends"](registered.append)
    assert registered == [namespace["MyBackend"]]


# ------------------------------------------------------------ what other pages promise (was README)


def test_plugins_page_installs_the_cpu_torch_before_the_plugin():
    page = text(DOCS / "plugins.md")
    cpu = 'pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu'
    assert cpu in page
    assert page.index(cpu) < page.index("pip install -e plugins/inferno-gpt2-torch")


def test_development_page_says_what_ci_runs_of_the_heavy_tests():
    ci = text(ROOT / ".ci" / "run")
    page = text(DOCS / "development.md")
    assert "python -m pytest -q -m 'heavy or slow' --ignore=tests/serve" in ci
    assert "python -m pytest -q -m 'heavy or slow' tests/serve" in ci
    assert "`.ci/run` runs them too" in page and "the `heavy` and `slow` tests" in page


def test_benchmark_sections_say_how_and_when():
    page = text(DOCS / "benchmarks.md")
    # A command in backticks or on a line of a code block, or a one-off script said to be one.
    command = re.compile(r"`(env [^`]+ |OPENBLAS_CORETYPE=\S+ )?(python|inferno) [^`]+`"
                         r"|^(python|inferno) \S|one-off", re.M)
    figure = re.compile(r"\d ?(tok/s|ms\b|µs|us\b|GB/s|MB/s|GFLOP)")
    for part in re.split(r"\n(?=## )", page)[1:]:
        heading = part.splitlines()[0]
        if figure.search(part):
            assert command.search(part), f"{heading}: figures without the command that measured them"
            assert re.search(r"20\d\d-\d\d-\d\d", part), f"{heading}: figures without their date"


# The figure check's rule. A measured figure is a number (not part of a name such as GPT-2, 124M or
# layer_4) that is
#   - followed by a unit of time or speed: 12 ms, 30 tok/s, 8 GB/s (not seconds: "60 s" is a timeout);
#   - a ratio glued to its x: 2.7x, 10x (a spaced "0.5 x" is a formula);
#   - a percentage: 25%, 3.5 %;
#   - within a clause (no . ; : between them) of measured, faster, slower, speedup or slowdown;
# or a diary phrase: "median(s) of", "paired runs/rounds". Only prose is read: comments and docstrings
# of inferno/ and the plugins' packages (and the C kernels' comments); strings that code prints, and the
# tests' comments on the tolerances they check, are not figures of a benchmark.
_NUMBER = r"(?<![\w.\-/])\d+(?:[.,]\d+)?"
MEASURED_FIGURE = re.compile(
    rf"{_NUMBER}\s?(?:ms|µs|us|ns|tok/s|tokens/s|GB/s|MB/s|GFLOP/s|GFLOPS?|it/s)(?![\w/])"
    rf"|{_NUMBER}[x×](?!\w)"
    rf"|{_NUMBER}\s?%"
    rf"|\b(?:measured|faster|slower|speed-?ups?|slowdown)\b[^.;:\n]{{0,40}}?{_NUMBER}(?![\w])"
    rf"|{_NUMBER}(?![\w])[^.;:\n]{{0,40}}?\b(?:measured|faster|slower|speed-?ups?|slowdown)\b"
    r"|\bmedians? of\b|\bpaired (?:runs|rounds)\b",
    re.I)


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every comment and docstring line of a Python or C file."""
    import io
    import tokenize

    source = text(path)
    if path.suffix == ".c":
        found = []
        for m in re.finditer(r"/\*.*?\*/|//[^\n]*", source, re.S):
            first = source.count("\n", 0, m.start()) + 1
            found += [(first + i, line) for i, line in enumerate(m.group(0).splitlines())]
        return found
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found += [(node.body[0].lineno + i, line) for i, line in enumerate(doc.splitlines())]
    return found


@pytest.mark.parametrize(("line", "figure"), [
    ("# measured 29.2 ms/token", True), ("it ran 2.7x faster", True), ("10x slower", True),
    ("# 25% of the time", True), ("# 8 rows measured faster than 6", True), ("30 tok/s", True),
    ("median of 5 runs", True), ("the fused MLP was faster by 12 percent", True),
    ("# GPT-2 alone runs them too, slower", False), ("0.5 x (1 + tanh(x))", False),
    ("several times faster at the 124M shape", False), ("# at most 1024 threads (MAX_THREADS)", False),
    ("# tiles of 64 queries", False), ("0x7FFF + bit", False), ("# wait 60 s for a hung test", False),
    ("layer_4 is slower", False),
])
def test_the_figure_rule(line, figure):
    assert bool(MEASURED_FIGURE.search(line)) is figure


def test_no_comment_or_docstring_holds_a_measured_figure():
    # Measured figures belong in docs/benchmarks.md with the command that measures them; comments and
    # docstrings say what a choice is and why, and point there.
    files = {*ROOT.glob("inferno/**/*.py"), *ROOT.glob("plugins/*/*.py"), *ROOT.glob("plugins/*/*/*.py"),
             *ROOT.glob("plugins/**/*.c")}
    files = {f for f in files if "/tests/" not in f.as_posix() and "egg-info" not in f.as_posix()
             and "/build/" not in f.as_posix()}
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in sorted(files)
             for number, line in prose_lines(path) if MEASURED_FIGURE.search(line)]
    assert not found, "measured figures in comments (move them to docs/benchmarks.md):\n" + "\n".join(found)


def test_llm_page_quotes_the_load_errors_inferno_gives(tmp_path):
    # llm-inferno shows a load failure as "Error: inferno could not load 'SOURCE': " + inferno's message.
    page = text(DOCS / "llm.md")
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(Exception) as missing:  # noqa: B017 - whichever error inferno.load gives, quoted
        inferno.load(str(empty), None, download=False)
    quoted = f"Error: inferno could not load '{empty}': {missing.value}"
    quoted = quoted.replace(str(empty), "/tmp/empty-model")
    assert quoted in page, f"docs/llm.md should quote:\n{quoted}"
    with pytest.raises(Exception) as unknown:  # noqa: B017
        inferno.load("gpt2", "nope", download=False)
    first = str(unknown.value).split(" Known backends")[0]  # the list depends on the plugins installed
    assert f"Error: inferno could not load 'gpt2': {first}" in page
