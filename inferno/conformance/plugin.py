"""pytest plugin behind ``pytest --pyargs inferno.conformance --backend NAME``.

pytest loads it in every run of an environment where inferno is installed (the ``pytest11`` entry
point), so it stays inert unless asked:

* it always adds only namespaced options, which cannot clash with other plugins or a project's
  ``conftest.py``: ``--inferno-backend SPEC``, ``--inferno-xfails FILE``, ``--inferno-skips FILE``;
* the short spellings the suite documents, ``--backend``, ``--conformance-xfails`` and
  ``--conformance-skips``, are added only when the command line targets this package
  (``--pyargs inferno.conformance[...]`` or a path inside it), and only if no other plugin took them;
* it constructs a backend, prints a report header and marks tests only in such a run (or when
  ``--inferno-backend`` is given), and only ever marks tests of this package.

Without the entry point (or with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), load it by hand::

    pytest -p inferno.conformance.plugin --pyargs inferno.conformance --backend NAME

**Expected failures.** ``--conformance-xfails FILE`` marks tests as xfail, ``--conformance-skips FILE``
skips them (for kernels that crash or hang). One entry per line, ``#`` starts a comment; an entry
matches a check id (``softmax-large-magnitude``), a whole kernel (``softmax``), or a test's node id
or name (``test_kernel[softmax-large-magnitude]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PACKAGE = "inferno.conformance"
_HERE = Path(__file__).resolve().parent

# Short spelling -> the namespaced option's dest.
_ALIASES = {
    "--backend": "inferno_backend",
    "--conformance-xfails": "inferno_xfails",
    "--conformance-skips": "inferno_skips",
}


@dataclass
class _Session:
    """What the plugin resolved for this run (kept on ``config.stash``)."""

    spec: str
    backend: Any = None
    info: Any = None
    xfails: dict[str, set[str]] = field(default_factory=dict)  # "xfail"/"skip" -> entries
    sources: dict[str, str] = field(default_factory=dict)  # "xfail"/"skip" -> file
    used: set[str] = field(default_factory=set)


_targeted = pytest.StashKey[bool]()
_session = pytest.StashKey[_Session]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("inferno", "inferno backend conformance (pytest --pyargs inferno.conformance)")
    group.addoption(
        "--inferno-backend", dest="inferno_backend", metavar="SPEC", default=None,
        help="backend to check, NAME[:key=value,...] (default: $INFERNO_BACKEND, else numpy); "
        "--backend when the run targets inferno.conformance",
    )
    group.addoption(
        "--inferno-xfails", dest="inferno_xfails", metavar="FILE", default=None,
        help="file of conformance check ids / kernels / test ids expected to fail (one per line); "
        "--conformance-xfails when the run targets inferno.conformance",
    )
    group.addoption(
        "--inferno-skips", dest="inferno_skips", metavar="FILE", default=None,
        help="like --inferno-xfails, but the tests are skipped; --conformance-skips likewise",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    # After every plugin and the initial conftest.py files added their options, before the final parse:
    # the one moment to add ours without taking a name someone else uses.
    yield
    pyargs = bool(getattr(early_config.known_args_namespace, "pyargs", False))
    targeted = _targets_suite(args, pyargs, Path(early_config.invocation_params.dir))
    early_config.stash[_targeted] = targeted
    if not targeted:
        return
    taken = _option_names(parser)
    group = parser.getgroup("inferno")
    for alias, dest in _ALIASES.items():
        if alias not in taken:
            group.addoption(alias, dest=dest, default=None, help=f"same as --{dest.replace('_', '-')}")


def _targets_suite(args: list[str], pyargs: bool, invocation_dir: Path) -> bool:
    for arg in args:
        if arg.startswith("-"):
            continue
        if pyargs and (arg == PACKAGE or arg.startswith((PACKAGE + ".", PACKAGE + "::"))):
            return True
        path = (invocation_dir / arg.split("::", 1)[0]).resolve()
        if path == _HERE or _HERE in path.parents:
            return True
    return False


def _option_names(parser: pytest.Parser) -> set[str]:
    """Every option string registered so far (pytest has no public API for this)."""
    names: set[str] = set()
    for group in (getattr(parser, "_anonymous", None), *getattr(parser, "_groups", ())):
        for option in getattr(group, "options", ()):
            names.update(option.names())
    return names


def _active(config: pytest.Config) -> bool:
    return config.stash.get(_targeted, False) or config.getoption("inferno_backend", None) is not None


def pytest_configure(config: pytest.Config) -> None:
    if not _active(config):
        return
    from inferno.backends import registry

    spec = config.getoption("inferno_backend") or registry._default_spec()
    session = _Session(spec)
    name, _ = registry.parse_backend_spec(spec)
    try:
        session.info = registry.get_backend_info(name)
        session.backend = registry.get_backend(spec)
    except Exception as exc:  # noqa: BLE001 - unknown, unavailable, bad options: all a usage error
        raise pytest.UsageError(f"inferno conformance: cannot use backend {spec!r}: {exc}") from exc
    for kind, opt in (("xfail", "inferno_xfails"), ("skip", "inferno_skips")):
        path = config.getoption(opt)
        if path:
            session.xfails[kind] = _read_ids(Path(path))
            session.sources[kind] = str(path)
    config.stash[_session] = session


def _read_ids(path: Path) -> set[str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise pytest.UsageError(f"inferno conformance: cannot read {path}: {exc}") from exc
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return {line for line in lines if line}


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_session, None)
    if session is not None and session.backend is not None:
        session.backend.close()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = config.stash.get(_session, None)
    if session is None:
        return None
    from inferno.conformance.checks import dtype_name, tolerance_for

    info, be = session.info, session.backend
    origin = "built-in" if info.origin == "built-in" else f"distribution {info.origin}"
    lines = [
        f"inferno conformance: backend {info.name!r} ({origin} {info.version}); spec {session.spec!r}",
        f"  {be!r}; dtype {dtype_name(be.dtype)}; tolerance {tolerance_for(be.dtype)}",
    ]
    for kind, src in session.sources.items():
        lines.append(f"  {kind}s from {src}: {len(session.xfails[kind])} entries")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash.get(_session, None)
    if session is None or not session.xfails:
        return
    for item in items:
        if _HERE not in Path(str(item.path)).resolve().parents:
            continue  # only ever touch the suite's own tests
        keys = {item.nodeid, item.name}
        check = getattr(getattr(item, "callspec", None), "params", {}).get("check")
        if check is not None:
            keys |= {check.id, check.kernel}
        for kind, entries in session.xfails.items():
            hit = entries & keys
            if hit:
                session.used |= hit
                reason = f"listed in {session.sources[kind]}"
                item.add_marker(pytest.mark.skip(reason=reason) if kind == "skip"
                                else pytest.mark.xfail(reason=reason, strict=False))


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    session = config.stash.get(_session, None)
    if session is None:
        return None
    unused = sorted(set().union(*session.xfails.values()) - session.used) if session.xfails else []
    return [f"inferno conformance: entries matching no test: {', '.join(unused)}"] if unused else None


def session_backend(config: pytest.Config) -> Any:
    """The backend under test: the plugin's, or the default one if the plugin did not run."""
    session = config.stash.get(_session, None)
    if session is not None:
        return session.backend
    from inferno.backends.registry import get_backend

    return get_backend()
