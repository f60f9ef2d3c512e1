"""Find the compute backends and construct them by name.

Backends are plugins. A distribution names a module in the ``inferno.backends`` entry-point group; that
module implements the `register_backends` hook (see `inferno.backends.hookspecs`). The built-in
``numpy``, ``array-api`` and ``cpu-threaded`` backends register through the very same entry points (with
a fallback that imports them directly when the package runs from a source tree without its metadata).

    >>> from inferno.backends.registry import get_backend, list_backends
    >>> [(info.name, info.origin, info.status) for info in list_backends()][:2]
    [('numpy', 'built-in', 'ok'), ('array-api', 'built-in', 'ok')]
    >>> get_backend("numpy", dtype="float64")
    <NumpyBackend 'numpy'>

**Backend specs.** Wherever a backend is named by a string (``get_backend``, the CLI's ``--backend``,
the ``INFERNO_BACKEND`` environment variable, the conformance suite's ``--backend``) it may carry
constructor options::

    name[:key=value[,key=value...]]         e.g.  numpy:dtype=float64
                                                  torch:device=cuda,dtype=bfloat16

Values that read as Python ints, floats or booleans (``true``/``false``, any case) or ``none`` are
converted; everything else is passed as a string. Keyword options given to `get_backend` override
those in the spec.

**Broken plugins.** Discovery happens once per process, on first use. A plugin that fails to import
(any exception, `SystemExit` included; only `KeyboardInterrupt` goes through), has a bad hook signature,
raises in its hook, or registers something that is not a usable `Backend` subclass is skipped; the other
backends keep working. It is reported only where it matters: `list_backends` (``inferno backends``)
issues one `BackendPluginWarning` per broken plugin, once per process, shown as one line (no source
line), and shows the failure as the status; asking for it by name raises `BackendUnavailableError` with
the reason. Using another backend prints nothing. Where a broken plugin must fail loudly, escalate the
warning: ``warnings.simplefilter("error", BackendPluginWarning)``, in pytest ``-W
error::inferno.backends.registry.BackendPluginWarning``, for the command ``python -W error::UserWarning -m
inferno ...`` (Python's own -W cannot import a category from a package).

**A backend failing at run time.** Whatever a backend's constructor raises, apart from the option
errors (TypeError, ValueError: `BackendOptionError`) and `BackendUnavailableError`, becomes a
`BackendError` naming the backend and the call; so do the exceptions of its `prepare_weight`,
`weight_order` and kernels (see `inferno.models.gpt2`), and the wrong shapes or non-finite values it returns.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import pluggy

from inferno.backends import hookspecs
from inferno.backends.base import Backend
from inferno.errors import (  # noqa: F401 - the errors, re-exported where they were
    BackendError,
    BackendOptionError,
    BackendUnavailableError,
    one_line,
    squash,
)

__all__ = [
    "BackendError",
    "BackendInfo",
    "BackendOptionError",
    "BackendPluginWarning",
    "BackendUnavailableError",
    "UnknownBackendError",
    "default_backend_name",
    "get_backend",
    "get_backend_class",
    "get_backend_info",
    "list_backends",
    "parse_backend_spec",
]

ENTRY_POINT_GROUP = "inferno.backends"
ENV_VAR = "INFERNO_BACKEND"
DEFAULT_BACKEND = "numpy"
BUILT_IN = "built-in"

# Registered in this order, before any third-party plugin, so that no plugin can take their names.
_BUILTINS = {
    "numpy": "inferno.backends.numpy_backend",
    "array-api": "inferno.backends.array_api",
    "cpu-threaded": "inferno.backends.threaded",
}
_BUILTIN_MODULES = tuple(_BUILTINS.values())
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class UnknownBackendError(ValueError):
    """No backend of that name is registered (not even a broken one)."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        super().__init__(
            f"unknown backend {name!r}.{hint} Known backends: {', '.join(known) or '(none)'}"
            " (see 'inferno backends')."
        )


class BackendPluginWarning(UserWarning):
    """A backend plugin failed to load or registered something unusable; it was skipped."""


@dataclass(frozen=True)
class BackendInfo:
    """One row of ``inferno backends``."""

    name: str
    description: str
    #: "built-in", or the name of the distribution that provides the backend.
    origin: str
    #: The providing distribution's version (inferno's own for the built-ins); "" when unknown.
    version: str
    #: "ok", or one line saying why the backend is unavailable.
    status: str
    #: What executes its kernels (`Backend.runs_on`): compiled code or a fallback; "" when not said.
    runs_on: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ------------------------------------------------------------------------------------------ specs


def parse_backend_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split ``"name:key=value,key=value"`` into the name and a dict of options.

    >>> parse_backend_spec("torch:device=cuda,dtype=bfloat16")
    ('torch', {'device': 'cuda', 'dtype': 'bfloat16'})
    >>> parse_backend_spec("numpy:threads=4")
    ('numpy', {'threads': 4})
    """
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise BackendOptionError(f"backend spec {spec!r} has no name (expected 'name[:key=value,...]')")
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise BackendOptionError(f"backend spec {spec!r}: expected key=value, got {item!r}")
        if key in options:
            raise BackendOptionError(f"backend spec {spec!r}: option {key!r} given twice")
        options[key] = _parse_value(value.strip())
    return name, options


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def default_backend_name() -> str:
    """The backend used when none is named: ``$INFERNO_BACKEND`` (its name part), else "numpy"."""
    return parse_backend_spec(_default_spec())[0]


def _default_spec() -> str:
    return os.environ.get(ENV_VAR, "").strip() or DEFAULT_BACKEND


# ------------------------------------------------------------------------------------- discovery


@dataclass
class _Entry:
    """A registered backend class, or a placeholder for a plugin that failed (cls is None)."""

    name: str
    cls: type[Backend] | None
    origin: str
    version: str
    error: str | None = None


class _Registry:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.entries: dict[str, _Entry] = {}
        # plugin module -> (origin, version, entry-point name), for the hook calls and the messages.
        self.sources: dict[object, tuple[str, str, str]] = {}
        # Warnings not yet issued: list_backends issues them, once (see the module docstring).
        self.pending: list[str] = []

    def discover(self) -> None:
        eps = _entry_points()
        # A source tree without installed metadata (or with only some of it) still has its built-ins, in
        # their order.
        named = {ep.value for ep in eps}
        eps = _builtins_first([*eps, *(_BuiltinEntryPoint(name, mod) for name, mod in _BUILTINS.items()
                                       if mod not in named)])
        for ep in eps:
            origin, version = _origin(ep)
            try:
                module = ep.load()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - SystemExit too: a plugin never ends the process
                self._fail(ep.name, origin, version, f"failed to import {ep.value!r}: {one_line(exc)}")
                continue
            self._register(module, origin, version, ep.name)
        self._call_hooks()

    def _register(self, module: object, origin: str, version: str, ep_name: str) -> None:
        if self.pm.is_registered(module):
            return  # the same module named by two entry points
        try:
            self.pm.register(module, name=f"{origin}:{ep_name}")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - PluginValidationError (bad hook signature) and the like
            self._fail(ep_name, origin, version, f"invalid plugin: {one_line(exc)}")
            return
        self.sources[module] = (origin, version, ep_name)

    def _call_hooks(self) -> None:
        # One plugin at a time (not one pm.hook call) so that a plugin raising only loses its own backends.
        for impl in self.pm.hook.register_backends.get_hookimpls():
            origin, version, ep_name = self.sources[impl.plugin]

            def register(cls: type[Backend], _source=(origin, version, ep_name)) -> None:
                self._add(cls, *_source)

            try:
                impl.function(**{arg: register for arg in impl.argnames})
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001
                self._fail(ep_name, origin, version, f"register_backends() raised {one_line(exc)}")

    def _add(self, cls: object, origin: str, version: str, ep_name: str) -> None:
        """Validate and record one registered class (the `register` callback of the hook)."""
        name = getattr(cls, "name", None) if isinstance(cls, type) else None
        label = name if isinstance(name, str) and name else ep_name
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            self._fail(label, origin, version, f"registered {cls!r}, which is not a Backend subclass")
        elif not isinstance(name, str) or not _NAME_RE.match(name):
            self._fail(label, origin, version,
                       f"registered {cls.__qualname__} with an invalid name {name!r} "
                       "(set `name`: lower case letters, digits, '-', '_' or '.')")
        elif name in self.entries and self.entries[name].cls is not None:
            first = self.entries[name]
            if first.cls is not cls:
                where = first.origin if first.origin == BUILT_IN else f"distribution {first.origin!r}"
                self._warn(origin, version, f"registered {cls.__qualname__} under the name {name!r}, "
                           f"already taken by {where}; skipped")
        elif inspect.isabstract(cls):
            missing = ", ".join(sorted(cls.__abstractmethods__))
            self._fail(label, origin, version, f"{cls.__qualname__} does not implement: {missing}")
        else:
            self._put(_Entry(name, cls, origin, version))

    def _fail(self, name: str, origin: str, version: str, error: str) -> None:
        self._warn(origin, version, f"{error}; skipped")
        # Keep the first working registration of a name; otherwise remember why it is unavailable.
        if name not in self.entries or self.entries[name].cls is None:
            self._put(_Entry(name, None, origin, version, error))

    def _put(self, entry: _Entry) -> None:
        self.entries[entry.name] = entry

    def _warn(self, origin: str, version: str, message: str) -> None:
        who = "built-in backend" if origin == BUILT_IN else f"backend plugin {origin} {version}".rstrip()
        self.pending.append(f"inferno: {who}: {message}")

    def issue_warnings(self) -> None:
        """Issue the pending warnings, each once per process, as one line each: no source line is shown
        (there is no file to point at; the plugin is the culprit, not the caller)."""
        with _lock:
            pending, self.pending = self.pending, []
        for message in pending:
            warnings.warn_explicit(message, BackendPluginWarning, filename="inferno", lineno=0,
                                   module="inferno.backends.registry")

    def ordered(self) -> list[_Entry]:
        """Built-ins first, in their fixed order, then the others by name."""
        entries = list(self.entries.values())
        # A built-in that failed to import is recorded before the others register: place it by name.
        rank = {name: i for i, name in enumerate(_BUILTINS)}
        builtins = sorted((e for e in entries if e.origin == BUILT_IN),
                          key=lambda e: rank.get(e.name, len(rank)))
        return builtins + sorted((e for e in entries if e.origin != BUILT_IN), key=lambda e: e.name)


@dataclass(frozen=True)
class _BuiltinEntryPoint:
    """Stands in for a built-in's entry point when the package metadata is not installed."""

    name: str
    value: str

    def load(self) -> object:
        return importlib.import_module(self.value)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _builtins_first(eps: list[Any]) -> list[Any]:
    """Built-ins first (in their fixed order), then third-party plugins by distribution and name."""

    def key(ep: Any) -> tuple:
        if ep.value in _BUILTIN_MODULES:
            return (0, _BUILTIN_MODULES.index(ep.value), "", "")
        return (1, 0, _origin(ep)[0], ep.name)

    return sorted(eps, key=key)


def _origin(ep: Any) -> tuple[str, str]:
    """(origin, version) of an entry point: "built-in" for inferno's own modules, else its distribution."""
    if ep.value in _BUILTIN_MODULES:
        return BUILT_IN, _inferno_version()
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown distribution", ""
    return dist.name or "unknown distribution", dist.version or ""


def _inferno_version() -> str:
    from inferno.version import __version__

    return __version__


# ------------------------------------------------------------------------------------------- API

_lock = threading.Lock()
_registry: _Registry | None = None


def _get() -> _Registry:
    global _registry
    with _lock:
        if _registry is None:
            registry = _Registry()
            registry.discover()
            _registry = registry
        return _registry


def _reset() -> None:
    """Forget what was discovered (for tests): the next call discovers again."""
    global _registry
    with _lock:
        _registry = None


def _status(entry: _Entry) -> str:
    if entry.error is not None:
        return entry.error
    try:
        reason = entry.cls.unavailable_reason()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a crashing check means it cannot run
        return f"unavailable_reason() raised {one_line(exc)}"
    return "ok" if reason is None else squash(reason)


def _runs_on(entry: _Entry) -> str:
    if entry.cls is None:
        return ""
    try:
        return squash(str(entry.cls.runs_on()))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a listing never fails for one plugin's bug
        return f"runs_on() raised {one_line(exc)}"


def _info(entry: _Entry) -> BackendInfo:
    description = entry.cls.description if entry.cls is not None else ""
    return BackendInfo(entry.name, description, entry.origin, entry.version, _status(entry), _runs_on(entry))


def list_backends() -> list[BackendInfo]:
    """Every backend known to this process, built-ins first, broken plugins included (see `status`).

    The first call issues a `BackendPluginWarning` for each broken plugin (once per process)."""
    registry = _get()
    registry.issue_warnings()
    return [_info(entry) for entry in registry.ordered()]


def _entry(name: str) -> _Entry:
    registry = _get()
    if name not in registry.entries:
        raise UnknownBackendError(name, [e.name for e in registry.ordered()])
    return registry.entries[name]


def get_backend_info(name: str) -> BackendInfo:
    """The `BackendInfo` of one backend (a bare name, not a spec). Raises `UnknownBackendError`."""
    return _info(_entry(name))


def get_backend_class(name: str) -> type[Backend]:
    """The class registered under `name`, without constructing it.

    Raises `UnknownBackendError`, or `BackendUnavailableError` if its plugin failed to load or its
    `unavailable_reason()` says it cannot run here.
    """
    entry = _entry(name)
    status = _status(entry)
    if status != "ok" or entry.cls is None:
        where = "" if entry.origin == BUILT_IN else f" (from {entry.origin} {entry.version}".rstrip() + ")"
        raise BackendUnavailableError(f"backend {name!r}{where} is unavailable: {status}")
    return entry.cls


def get_backend(name: str | None = None, **options: Any) -> Backend:
    """Construct a backend by name or spec (``"name:key=value,..."``); None means the default.

    The default is ``$INFERNO_BACKEND`` (a spec too), else "numpy". Keyword `options` are passed to the
    backend's constructor and override options in the spec::

        get_backend()                                   # $INFERNO_BACKEND or numpy
        get_backend("numpy", dtype="float64")
        get_backend("numpy:dtype=float64")

    Raises `UnknownBackendError` (a ValueError) for a name nobody registered and
    `BackendUnavailableError` (a RuntimeError) for one that cannot run here.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"a backend is named by a str such as 'numpy' or 'numpy:dtype=float64', "
                        f"not {type(name).__name__} ({name!r:.40})")
    backend_name, spec_options = parse_backend_spec(_default_spec() if name is None else name)
    cls = get_backend_class(backend_name)
    kwargs = {**spec_options, **options}
    try:
        accepted = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):  # a C-level or otherwise unintrospectable __init__: let the call say
        accepted = None
    if accepted is not None and not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            names = [n for n, p in accepted.items() if n != "self" and p.kind is not p.VAR_POSITIONAL]
            raise BackendOptionError(
                f"backend {backend_name!r} has no option {', '.join(map(repr, unknown))} "
                f"(its options: {', '.join(names) or 'none'})"
            )
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise BackendOptionError(f"backend {backend_name!r} rejected its options {kwargs}: {exc}") from exc
    except (BackendUnavailableError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - a plugin's failure, reported with its name
        entry = _entry(backend_name)
        where = "" if entry.origin == BUILT_IN else f" (from {entry.origin} {entry.version}".rstrip() + ")"
        raise BackendError(f"backend {backend_name!r}{where} failed to start: its constructor raised "
                           f"{one_line(exc)}") from exc
