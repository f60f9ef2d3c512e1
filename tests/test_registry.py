"""The backend registry: discovery through entry points, broken plugins isolated, names and specs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

import inferno
from inferno.backends import hookimpl, registry
from inferno.backends.array_api import ArrayApiBackend
from inferno.backends.numpy_backend import NumpyBackend
from inferno.backends.registry import (
    BackendOptionError,
    BackendPluginWarning,
    BackendUnavailableError,
    UnknownBackendError,
    default_backend_name,
    get_backend,
    get_backend_class,
    get_backend_info,
    list_backends,
    parse_backend_spec,
)

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(autouse=True)
def fresh_registry():
    registry._reset()
    yield
    registry._reset()


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("INFERNO_BACKEND", raising=False)


# ------------------------------------------------------------------------------------- built-ins


def test_builtins_are_listed_first_and_ok():
    infos = list_backends()
    assert [i.name for i in infos[:3]] == ["numpy", "array-api", "cpu-threaded"]
    for info in infos[:3]:
        assert (info.origin, info.version, info.status) == ("built-in", inferno.__version__, "ok")
        assert info.ok and info.description


def test_builtins_without_package_metadata(monkeypatch):
    # Running from a source tree: no entry points at all, the built-ins are still there.
    monkeypatch.setattr(registry, "_entry_points", lambda: [])
    assert [(i.name, i.origin, i.status) for i in list_backends()] == [
        ("numpy", "built-in", "ok"), ("array-api", "built-in", "ok"), ("cpu-threaded", "built-in", "ok")]
    assert isinstance(get_backend("array-api"), ArrayApiBackend)


def test_discovery_runs_once_until_reset(monkeypatch):
    calls = []
    real = registry._entry_points
    monkeypatch.setattr(registry, "_entry_points", lambda: calls.append(1) or real())
    list_backends()
    get_backend("numpy")
    get_backend_info("array-api")
    assert len(calls) == 1
    registry._reset()
    list_backends()
    assert len(calls) == 2


# ------------------------------------------------------------------------------- names and specs


def test_default_backend(monkeypatch, no_env):
    assert default_backend_name() == "numpy"
    be = get_backend()
    assert isinstance(be, NumpyBackend) and be.dtype == np.float32
    monkeypatch.setenv("INFERNO_BACKEND", "numpy:dtype=float64")
    assert default_backend_name() == "numpy"
    assert get_backend().dtype == np.float64
    assert get_backend(None, dtype="float32").dtype == np.float32  # keywords override the spec


def test_options_by_keyword_and_spec(no_env):
    assert get_backend("numpy", dtype="float64").dtype == np.float64
    assert get_backend("numpy:dtype=float64").dtype == np.float64
    assert get_backend("numpy:dtype=float64", dtype="float32").dtype == np.float32
    be = get_backend("array-api:xp=array_api_strict,dtype=float64")
    assert be.xp.__name__ == "array_api_strict" and be.dtype == np.float64


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("numpy", ("numpy", {})),
        (" numpy : dtype=float64 ", ("numpy", {"dtype": "float64"})),
        ("torch:device=cuda,dtype=bfloat16", ("torch", {"device": "cuda", "dtype": "bfloat16"})),
        ("x:threads=4,eps=1e-5,fused=true,pin=False,limit=none,name=a b",
         ("x", {"threads": 4, "eps": 1e-5, "fused": True, "pin": False, "limit": None, "name": "a b"})),
        ("x:", ("x", {})),
        ("x:a=1,", ("x", {"a": 1})),
    ],
)
def test_parse_backend_spec(spec, expected):
    assert parse_backend_spec(spec) == expected


@pytest.mark.parametrize("spec", ["", ":dtype=float64", "numpy:dtype", "numpy:a=1,a=2", "numpy:1x=2"])
def test_parse_backend_spec_rejects(spec):
    with pytest.raises(ValueError, match="backend spec"):
        parse_backend_spec(spec)


def test_unknown_backend_suggests_close_names():
    with pytest.raises(UnknownBackendError) as err:
        get_backend("nump")
    assert isinstance(err.value, ValueError)
    assert "Did you mean 'numpy'?" in str(err.value)
    assert "Known backends: numpy, array-api" in str(err.value)
    with pytest.raises(UnknownBackendError, match="unknown backend 'zzz'. Known backends"):
        get_backend_info("zzz")


def test_bad_options_are_named():
    # The backend's own message survives, and the error says which backend and options.
    with pytest.raises(BackendOptionError, match="'numpy'.*dtype must be float32 or float64"):
        get_backend("numpy:dtype=int8")
    # An option the constructor does not take is named, with the ones it does take.
    with pytest.raises(BackendOptionError, match=r"no option 'device' \(its options: dtype\)"):
        get_backend("numpy", device="cuda")


# ------------------------------------------------------------------- plugins, in-process fakes


class FakeEntryPoint:
    """What registry._entry_points yields, loading a module object made in the test."""

    def __init__(self, name: str, module: types.ModuleType | BaseException) -> None:
        self.name = name
        self.value = f"fake_{name.replace('-', '_')}"
        self.dist = types.SimpleNamespace(name=f"inferno-{name}", version="1.0")
        self._module = module

    def load(self):
        if isinstance(self._module, BaseException):
            raise self._module
        return self._module


def plugin(name: str, hook) -> types.ModuleType:
    module = types.ModuleType(f"fake_{name.replace('-', '_')}")
    module.register_backends = hookimpl(hook)
    return module


def backend_class(name: str, base: type = NumpyBackend, **attrs) -> type:
    attrs = {"name": name, "description": f"{name} test", **attrs}
    return type(name.title().replace("-", ""), (base,), attrs)


@pytest.fixture
def fake_plugins(monkeypatch):
    def install(*eps: FakeEntryPoint) -> None:
        real = registry._entry_points()
        monkeypatch.setattr(registry, "_entry_points", lambda: [*real, *eps])
        registry._reset()

    return install


def test_broken_plugins_are_reported_once_and_skipped(fake_plugins):
    good = backend_class("fake-good")
    abstract = type("Abstract", (registry.Backend,), {"name": "fake-abstract"})
    fake_plugins(
        FakeEntryPoint("fake-good", plugin("fake-good", lambda register: register(good))),
        FakeEntryPoint("fake-import", ImportError("No module named 'cuda_thing'")),
        FakeEntryPoint("fake-raises", plugin("fake-raises", lambda register: 1 / 0)),
        FakeEntryPoint("fake-object", plugin("fake-object", lambda register: register(object()))),
        FakeEntryPoint("fake-abstract", plugin("fake-abstract", lambda register: register(abstract))),
        FakeEntryPoint("fake-noname", plugin("fake-noname", lambda register: register(backend_class("")))),
        FakeEntryPoint("fake-badname",
                       plugin("fake-badname", lambda register: register(backend_class("Bad Name")))),
        FakeEntryPoint("fake-numpy", plugin("fake-numpy", lambda register: register(backend_class("numpy")))),
        FakeEntryPoint("fake-signature", plugin("fake-signature", lambda reg, extra: None)),
    )
    with pytest.warns(BackendPluginWarning) as record:
        infos = {i.name: i for i in list_backends()}
    messages = [str(w.message) for w in record]
    assert len(messages) == 8, messages
    for dist in ("import", "raises", "object", "abstract", "noname", "badname", "numpy", "signature"):
        assert sum(f"inferno-fake-{dist} 1.0" in m for m in messages) == 1, (dist, messages)

    assert infos["numpy"].ok and infos["numpy"].origin == "built-in"
    assert get_backend_class("numpy") is NumpyBackend  # a plugin cannot take a built-in's name
    assert infos["array-api"].ok
    assert infos["fake-good"].ok and infos["fake-good"].origin == "inferno-fake-good"
    assert type(get_backend("fake-good")) is good
    assert infos["fake-import"].status == \
        "failed to import 'fake_fake_import': ImportError: No module named 'cuda_thing'"
    assert infos["fake-raises"].status == "register_backends() raised ZeroDivisionError: division by zero"
    assert "not a Backend subclass" in infos["fake-object"].status
    assert "does not implement" in infos["fake-abstract"].status and "linear" in infos["fake-abstract"].status
    assert "invalid name ''" in infos["fake-noname"].status
    assert "invalid name 'Bad Name'" in infos["Bad Name"].status
    assert "PluginValidationError" in infos["fake-signature"].status

    for name in ("fake-import", "fake-raises", "fake-object", "fake-abstract", "fake-signature"):
        with pytest.raises(BackendUnavailableError, match=f"backend '{name}' \\(from inferno-{name} 1.0\\)"):
            get_backend(name)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list_backends()  # cached: nothing is reported twice


def test_unavailable_reason_is_the_status(fake_plugins):
    needs_gpu = backend_class("fake-gpu", unavailable_reason=classmethod(lambda cls: "needs\n a GPU"))
    crashing = backend_class("fake-crash", unavailable_reason=classmethod(lambda cls: 1 / 0))
    fake_plugins(FakeEntryPoint("fake-gpu", plugin("fake-gpu", lambda register: (register(needs_gpu),
                                                                                  register(crashing)))))
    infos = {i.name: i for i in list_backends()}
    assert infos["fake-gpu"].status == "needs a GPU"  # one line
    assert infos["fake-crash"].status == "unavailable_reason() raised ZeroDivisionError: division by zero"
    with pytest.raises(BackendUnavailableError,
                       match="'fake-gpu' \\(from inferno-fake-gpu 1.0\\) is unavailable: needs a GPU"):
        get_backend("fake-gpu")


def test_runs_on_is_listed_in_one_line_and_a_crash_in_it_is_said(fake_plugins):
    said = backend_class("fake-c", runs_on=classmethod(lambda cls: "compiled C\n (AVX2)"))
    crashing = backend_class("fake-bad", runs_on=classmethod(lambda cls: 1 / 0))
    fake_plugins(FakeEntryPoint("fake-c", plugin("fake-c", lambda register: (register(said),
                                                                              register(crashing)))))
    infos = {i.name: i for i in list_backends()}
    assert infos["fake-c"].runs_on == "compiled C (AVX2)" and infos["fake-c"].status == "ok"
    assert infos["fake-bad"].runs_on == "runs_on() raised ZeroDivisionError: division by zero"
    assert infos["numpy"].runs_on == "NumPy + BLAS" and infos["cpu-threaded"].runs_on.startswith("NumPy")


# ---------------------------------------------------------- plugins, real distributions, end to end

SCRIPT = textwrap.dedent("""
    import dataclasses, json
    from inferno.backends import registry

    infos = [dataclasses.asdict(i) for i in registry.list_backends()]
    registry.list_backends()
    errors = {}
    for name in %r:
        try:
            registry.get_backend(name)
        except Exception as exc:
            errors[name] = [type(exc).__name__, str(exc)]
    print(json.dumps({"infos": infos, "errors": errors}))
""")


def run_with_plugins(dirs: list[str], code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run Python with the fake distributions in `dirs` on sys.path, so importlib.metadata finds them."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(PLUGINS / d) for d in dirs), env.get("PYTHONPATH", "")])
    env.pop("INFERNO_BACKEND", None)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_plugin_distributions_end_to_end(tmp_path):
    broken = {
        "fake-broken-import": ("inferno-fake-broken-import 0.1.0",
                               "No module named 'inferno_fake_missing_gpu_library'"),
        "fake-bad-signature": ("inferno-fake-bad-signature 0.2.0", "PluginValidationError"),
        "fake-not-a-backend": ("inferno-fake-not-a-backend 0.3.0", "not a Backend subclass"),
        "fake-hook-raises": ("inferno-fake-hook-raises 0.4.0", "RuntimeError: no accelerator found"),
    }
    dirs = ["good", "broken_import", "bad_signature", "not_a_backend", "hook_raises"]
    proc = run_with_plugins(dirs, SCRIPT % ["fake-good", "numpy", "array-api", *broken], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    infos = {i["name"]: i for i in out["infos"]}

    assert [i["name"] for i in out["infos"][:2]] == ["numpy", "array-api"]
    assert infos["numpy"]["status"] == infos["array-api"]["status"] == "ok"
    assert infos["fake-good"] == {
        "name": "fake-good", "description": "A fake plugin backend (NumPy kernels) for the registry tests.",
        "origin": "inferno-fake-good", "version": "1.2.3", "status": "ok",
        "runs_on": "NumPy + BLAS"}  # it subclasses NumpyBackend
    assert set(out["errors"]) == set(broken)  # fake-good, numpy and array-api constructed fine
    for name, (dist, why) in broken.items():
        assert infos[name]["status"] != "ok" and why in infos[name]["status"]
        kind, message = out["errors"][name]
        assert kind == "BackendUnavailableError"
        assert f"backend {name!r} (from {dist}) is unavailable" in message and why in message
        # Reported once on stderr, naming the distribution and what went wrong.
        assert proc.stderr.count(f"backend plugin {dist}:") == 1, proc.stderr
        assert why in proc.stderr
    assert "fake-good" not in proc.stderr and "1.2.3" not in proc.stderr


# --------------------------------------------------------------- names taken, broken and repeated


@pytest.mark.parametrize(("name", "builtin"), [("numpy", NumpyBackend), ("array-api", ArrayApiBackend),
                                               ("cpu-threaded", None)])
def test_a_plugin_cannot_take_a_builtins_name(fake_plugins, name, builtin):
    from inferno.backends.threaded import ThreadedBackend

    builtin = builtin or ThreadedBackend
    impostor = backend_class(name, base=builtin)
    fake_plugins(FakeEntryPoint("fake-impostor",
                                plugin("fake-impostor", lambda register: register(impostor))))
    with pytest.warns(BackendPluginWarning) as record:
        infos = {i.name: i for i in list_backends()}
    assert [str(w.message) for w in record] == [
        f"inferno: backend plugin inferno-fake-impostor 1.0: registered {impostor.__qualname__} under the "
        f"name {name!r}, already taken by built-in; skipped"]
    assert get_backend_class(name) is builtin and infos[name].origin == "built-in" and infos[name].ok


def test_a_name_taken_by_another_plugin_is_kept_by_the_first(fake_plugins):
    first, second = backend_class("fake-dup"), backend_class("fake-dup")
    fake_plugins(FakeEntryPoint("fake-a", plugin("fake-a", lambda register: register(first))),
                 FakeEntryPoint("fake-b", plugin("fake-b", lambda register: register(second))))
    with pytest.warns(BackendPluginWarning) as record:
        info = get_backend_info("fake-dup") if list_backends() else None
    assert [str(w.message) for w in record] == [
        f"inferno: backend plugin inferno-fake-b 1.0: registered {second.__qualname__} under the name "
        "'fake-dup', already taken by distribution 'inferno-fake-a'; skipped"]
    assert get_backend_class("fake-dup") is first and info.origin == "inferno-fake-a"


def test_the_same_class_registered_twice_is_not_a_conflict(fake_plugins):
    cls = backend_class("fake-twice")
    fake_plugins(FakeEntryPoint("fake-twice", plugin("fake-twice", lambda register: (register(cls),
                                                                                      register(cls)))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_backend_info("fake-twice").ok and get_backend_class("fake-twice") is cls


@pytest.mark.parametrize("broken_first", [False, True])
def test_a_broken_registration_does_not_replace_a_working_one(fake_plugins, broken_first):
    good = backend_class("fake-dup")
    not_a_backend = type("NotABackend", (), {"name": "fake-dup"})  # fails under the same name
    eps = [FakeEntryPoint("fake-a", plugin("fake-a", lambda register: register(good))),
           FakeEntryPoint("fake-b", plugin("fake-b", lambda register: register(not_a_backend)))]
    if broken_first:  # third-party plugins register by distribution name: rename them to swap the order
        eps[0].dist.name, eps[1].dist.name = "inferno-fake-z", "inferno-fake-b"
    fake_plugins(*eps)
    with pytest.warns(BackendPluginWarning, match="NotABackend'>, which is not a Backend subclass"):
        list_backends()
    info = get_backend_info("fake-dup")
    assert info.ok and get_backend_class("fake-dup") is good
    assert info.origin == ("inferno-fake-z" if broken_first else "inferno-fake-a")


def test_an_import_failure_named_like_a_working_backend_leaves_it_working(fake_plugins):
    good = backend_class("fake-good")
    fake_plugins(FakeEntryPoint("fake-good", plugin("fake-good", lambda register: register(good))),
                 FakeEntryPoint("fake-good", ImportError("broken copy")))
    with pytest.warns(BackendPluginWarning, match="broken copy"):
        assert get_backend_info("fake-good").ok if list_backends() else False
    assert type(get_backend("fake-good")) is good


def test_keyboard_interrupt_in_a_plugin_is_not_swallowed(fake_plugins):
    fake_plugins(FakeEntryPoint("fake-ctrl-c", KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        list_backends()


# ---------------------------------------------------------------------------- options, constructors


class KeywordsBackend(NumpyBackend):
    name = "fake-kwargs"
    description = "takes any option"

    def __init__(self, dtype: str = "float32", **options) -> None:
        super().__init__(dtype=dtype)
        self.options = options


def test_a_backend_taking_any_keyword_gets_every_option(fake_plugins):
    fake_plugins(FakeEntryPoint("fake-kwargs",
                                plugin("fake-kwargs", lambda register: register(KeywordsBackend))))
    be = get_backend("fake-kwargs:alpha=1,path=a=b,flag=TRUE,off=None", beta="x")
    assert be.options == {"alpha": 1, "path": "a=b", "flag": True, "off": None, "beta": "x"}
    assert be.dtype == np.float32


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("x:path=a=b", ("x", {"path": "a=b"})),
        ("x:url=k=v=w, n=-2", ("x", {"url": "k=v=w", "n": -2})),
        ("x:e=", ("x", {"e": ""})),
        ("x:f=1e3,g=NONE,h=False,i=0x10", ("x", {"f": 1000.0, "g": None, "h": False, "i": "0x10"})),
        ("x : a = 1 ", ("x", {"a": 1})),
    ],
)
def test_parse_backend_spec_values(spec, expected):
    assert parse_backend_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "backend spec '' has no name (expected 'name[:key=value,...]')"),
        ("numpy:dtype", "backend spec 'numpy:dtype': expected key=value, got 'dtype'"),
        ("numpy:=3", "backend spec 'numpy:=3': expected key=value, got '=3'"),
        ("numpy:a=1,a=2", "backend spec 'numpy:a=1,a=2': option 'a' given twice"),
    ],
)
def test_parse_backend_spec_messages(spec, message):
    with pytest.raises(BackendOptionError) as info:
        parse_backend_spec(spec)
    assert str(info.value) == message


def test_a_backend_named_by_something_else_than_a_string():
    with pytest.raises(TypeError, match=r"a backend is named by a str .* not int \(3\)"):
        get_backend(3)  # type: ignore[arg-type]


def test_a_constructor_failure_names_the_backend_and_its_distribution(fake_plugins):
    def boom(self, **kwargs):
        raise RuntimeError("no\n device")

    def unavailable(self):
        raise BackendUnavailableError("gone")

    failing = backend_class("fake-boom", __init__=boom)
    gone = backend_class("fake-gone", __init__=unavailable)
    fake_plugins(FakeEntryPoint("fake-boom", plugin("fake-boom", lambda register: (register(failing),
                                                                                    register(gone)))))
    with pytest.raises(registry.BackendError) as info:
        get_backend("fake-boom")
    assert str(info.value) == ("backend 'fake-boom' (from inferno-fake-boom 1.0) failed to start: its "
                               "constructor raised RuntimeError: no device")
    with pytest.raises(BackendUnavailableError, match="^gone$"):
        get_backend("fake-gone")


def test_rejected_options_keep_the_backends_message(no_env):
    with pytest.raises(BackendOptionError) as info:
        get_backend("numpy:dtype=int8")
    assert str(info.value).startswith("backend 'numpy' rejected its options {'dtype': 'int8'}: ")


def test_backend_info_of_a_builtin(no_env):
    info = get_backend_info("numpy")
    assert info == registry.BackendInfo("numpy", NumpyBackend.description, "built-in", inferno.__version__,
                                        "ok", "NumPy + BLAS")
    assert info.ok and not registry.BackendInfo("x", "", "o", "", "needs a GPU").ok


# ------------------------------------------------------------------------ every message, word for word

INVALID_NAME = "(set `name`: lower case letters, digits, '-', '_' or '.')"


def test_every_broken_plugin_says_exactly_what_went_wrong(fake_plugins):
    something = object()
    abstract = type("Abstract", (registry.Backend,), {"name": "fake-abstract"})
    unnamed, bad_name = backend_class(""), backend_class("Bad Name")
    fake_plugins(
        FakeEntryPoint("fake-import", ImportError("No module named\n  'cuda_thing'")),
        FakeEntryPoint("fake-exit", SystemExit()),
        FakeEntryPoint("fake-raises", plugin("fake-raises", lambda register: 1 / 0)),
        FakeEntryPoint("fake-object", plugin("fake-object", lambda register: register(something))),
        FakeEntryPoint("fake-abstract", plugin("fake-abstract", lambda register: register(abstract))),
        FakeEntryPoint("fake-noname", plugin("fake-noname", lambda register: register(unnamed))),
        FakeEntryPoint("fake-badname", plugin("fake-badname", lambda register: register(bad_name))),
        FakeEntryPoint("fake-signature", plugin("fake-signature", lambda reg, extra: None)),
    )
    missing = ", ".join(sorted(registry.Backend.__abstractmethods__))
    statuses = {
        "fake-import": "failed to import 'fake_fake_import': ImportError: No module named 'cuda_thing'",
        "fake-exit": "failed to import 'fake_fake_exit': SystemExit",
        "fake-raises": "register_backends() raised ZeroDivisionError: division by zero",
        "fake-object": f"registered {something!r}, which is not a Backend subclass",
        "fake-abstract": f"Abstract does not implement: {missing}",
        "fake-noname": f"registered {unnamed.__qualname__} with an invalid name '' {INVALID_NAME}",
        "Bad Name": f"registered {bad_name.__qualname__} with an invalid name 'Bad Name' {INVALID_NAME}",
    }
    with pytest.warns(BackendPluginWarning) as record:
        infos = {i.name: i for i in list_backends()}
    for name, status in statuses.items():
        assert infos[name].status == status, name
        assert (infos[name].description, infos[name].version, infos[name].ok) == ("", "1.0", False)
    for name in ("fake-import", "fake-exit", "fake-raises"):  # no class to ask where it runs
        assert infos[name].runs_on == "", name
    assert infos["fake-signature"].status.startswith(
        "invalid plugin: PluginValidationError: Plugin 'inferno-fake-signature:fake-signature' for hook "
        "'register_backends'")
    dists = {"Bad Name": "inferno-fake-badname"}
    expected = sorted(f"inferno: backend plugin {dists.get(n, 'inferno-' + n)} 1.0: {s}; skipped"
                      for n, s in {**statuses, "fake-signature": infos["fake-signature"].status}.items())
    assert sorted(str(w.message) for w in record) == expected
    assert all(w.filename == "inferno" and w.lineno == 0 for w in record)


def test_a_distribution_without_a_version_or_a_name(fake_plugins):
    no_version = FakeEntryPoint("fake-nov", ImportError("gone"))
    no_version.dist.version = ""
    no_dist = FakeEntryPoint("fake-nodist", ImportError("gone"))
    no_dist.dist = None
    no_name = FakeEntryPoint("fake-noname", ImportError("gone"))
    no_name.dist.name = None
    fake_plugins(no_version, no_dist, no_name)
    with pytest.warns(BackendPluginWarning) as record:
        infos = {i.name: i for i in list_backends()}
    assert (infos["fake-nov"].origin, infos["fake-nov"].version) == ("inferno-fake-nov", "")
    assert (infos["fake-nodist"].origin, infos["fake-nodist"].version) == ("unknown distribution", "")
    assert (infos["fake-noname"].origin, infos["fake-noname"].version) == ("unknown distribution", "1.0")
    assert sorted(str(w.message) for w in record) == sorted([
        "inferno: backend plugin inferno-fake-nov: failed to import 'fake_fake_nov': ImportError: gone; "
        "skipped",
        "inferno: backend plugin unknown distribution: failed to import 'fake_fake_nodist': ImportError: "
        "gone; skipped",
        "inferno: backend plugin unknown distribution 1.0: failed to import 'fake_fake_noname': ImportError: "
        "gone; skipped"])
    with pytest.raises(BackendUnavailableError) as info:
        get_backend("fake-nov")
    assert str(info.value) == ("backend 'fake-nov' (from inferno-fake-nov) is unavailable: failed to "
                               "import 'fake_fake_nov': ImportError: gone")


def failing_builtin(monkeypatch, name: str, module: str, message: str, first: bool = False) -> None:
    """Replace the entry point of built-in `module` by one named `name` whose import raises
    ImportError(message), last (or `first`) among the real ones."""

    class Failing:
        value, dist = module, None

        def load(self):
            raise ImportError(message)

    Failing.name = name
    real = [ep for ep in registry._entry_points() if ep.value != module]
    eps = [Failing(), *real] if first else [*real, Failing()]
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)


def test_a_broken_builtin_is_reported_as_one(monkeypatch):
    failing_builtin(monkeypatch, "cpu-threaded", "inferno.backends.threaded", "no\nthreads")
    with pytest.warns(BackendPluginWarning) as record:
        infos = {i.name: i for i in list_backends()}
    status = "failed to import 'inferno.backends.threaded': ImportError: no threads"
    assert [str(w.message) for w in record] == [f"inferno: built-in backend: {status}; skipped"]
    assert {"numpy", "array-api"} <= {n for n, i in infos.items() if i.ok}
    assert (infos["cpu-threaded"].origin, infos["cpu-threaded"].version) == ("built-in", inferno.__version__)
    assert infos["cpu-threaded"].status == status
    with pytest.raises(BackendUnavailableError) as info:
        get_backend("cpu-threaded")
    assert str(info.value) == f"backend 'cpu-threaded' is unavailable: {status}"


def test_plugins_are_listed_by_name_after_the_builtins_and_registered_by_distribution(fake_plugins):
    order = []

    def hook(name):
        cls = backend_class(name)
        return lambda register: order.append(name) or register(cls)

    # Registered in distribution order (b before c), whatever the order of the entry points.
    eps = [FakeEntryPoint("fake-zz", plugin("fake-zz", hook("fake-zz"))),
           FakeEntryPoint("fake-aa", plugin("fake-aa", hook("fake-aa"))),
           FakeEntryPoint("fake-mm", plugin("fake-mm", hook("fake-mm")))]
    eps[0].dist.name, eps[1].dist.name, eps[2].dist.name = "inferno-c", "inferno-c", "inferno-b"
    fake_plugins(*eps)
    names = [i.name for i in list_backends()]
    assert names[:3] == ["numpy", "array-api", "cpu-threaded"]
    fakes = [n for n in names if n.startswith("fake-")]
    assert fakes == ["fake-aa", "fake-mm", "fake-zz"]
    assert order == ["fake-mm", "fake-aa", "fake-zz"]


def test_unknown_backend_messages():
    with pytest.raises(UnknownBackendError) as info:
        get_backend("nump")
    known = [i.name for i in list_backends()]
    assert str(info.value) == (f"unknown backend 'nump'. Did you mean 'numpy'? Known backends: "
                               f"{', '.join(known)} (see 'inferno backends').")
    assert (info.value.name, info.value.known) == ("nump", known)
    with pytest.raises(UnknownBackendError) as info:
        get_backend("cpu-thread")
    assert "Did you mean 'cpu-threaded'?" in str(info.value)
    with pytest.raises(UnknownBackendError) as info:
        get_backend_class("zzzzzz")
    assert str(info.value) == (
        f"unknown backend 'zzzzzz'. Known backends: {', '.join(known)} (see 'inferno backends').")
    several = UnknownBackendError("fake-a", ["fake-abcde", "fake-abc", "fake-ab", "fake-abcd", "other"])
    assert str(several) == ("unknown backend 'fake-a'. Did you mean 'fake-ab' or 'fake-abc' or 'fake-abcd'? "
                            "Known backends: fake-abcde, fake-abc, fake-ab, fake-abcd, other (see 'inferno "
                            "backends').")
    assert str(UnknownBackendError("x", [])) == (
        "unknown backend 'x'. Known backends: (none) (see 'inferno backends').")


def test_builtins_keep_their_order_whatever_the_entry_points_order(monkeypatch):
    real = registry._entry_points()
    monkeypatch.setattr(registry, "_entry_points", lambda: list(reversed(real)))
    assert [i.name for i in list_backends()][:3] == ["numpy", "array-api", "cpu-threaded"]


@pytest.mark.parametrize("installed", ["inferno.backends.numpy_backend", "inferno.backends.threaded"])
def test_builtins_keep_their_order_with_only_some_metadata_installed(monkeypatch, installed):
    # One built-in's entry point installed, the others supplied from the source tree.
    real = [ep for ep in registry._entry_points() if ep.value == installed]
    assert len(real) == 1
    monkeypatch.setattr(registry, "_entry_points", lambda: real)
    assert [(i.name, i.status) for i in list_backends()] == [
        ("numpy", "ok"), ("array-api", "ok"), ("cpu-threaded", "ok")]


def test_a_builtin_module_failing_under_another_entry_point_name_comes_after_the_builtins(monkeypatch):
    # A repackaged install naming the threaded module "threads": its failure is a built-in's, whose name
    # has no fixed place, so it follows the three.
    failing_builtin(monkeypatch, "threads", "inferno.backends.threaded", "gone", first=True)
    with pytest.warns(BackendPluginWarning):
        infos = list_backends()
    assert [(i.name, i.origin, i.ok) for i in infos][:3] == [
        ("numpy", "built-in", True), ("array-api", "built-in", True), ("threads", "built-in", False)]


@pytest.mark.parametrize("broken", ["numpy", "array-api", "cpu-threaded"])
def test_a_broken_builtin_keeps_its_place_in_the_list(monkeypatch, broken):
    # Its import fails before the others register: it is listed where it belongs all the same.
    failing_builtin(monkeypatch, broken, registry._BUILTINS[broken], "gone", first=True)
    with pytest.warns(BackendPluginWarning):
        infos = list_backends()
    assert [i.name for i in infos][:3] == ["numpy", "array-api", "cpu-threaded"]
    assert [i.name for i in infos if not i.ok] == [broken]


def test_one_module_named_by_two_entry_points_registers_once(fake_plugins):
    calls = []
    cls = backend_class("fake-shared")
    module = plugin("fake-shared", lambda register: calls.append(1) or register(cls))
    fake_plugins(FakeEntryPoint("fake-shared", module), FakeEntryPoint("fake-shared-again", module))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names = [i.name for i in list_backends()]
    assert "fake-shared" in names and "fake-shared-again" not in names
    assert get_backend_info("fake-shared").ok and get_backend_class("fake-shared") is cls
    assert calls == [1]


def test_the_warnings_can_be_filtered_by_the_registrys_module(fake_plugins):
    fake_plugins(FakeEntryPoint("fake-import", ImportError("gone")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", category=BackendPluginWarning,
                                module=r"inferno\.backends\.registry$")
        with pytest.raises(BackendPluginWarning, match="^inferno: backend plugin inferno-fake-import 1.0: "):
            list_backends()


@pytest.mark.parametrize("where", ["hook", "unavailable_reason", "constructor"])
def test_keyboard_interrupt_from_a_backend_is_not_swallowed(fake_plugins, where):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    attrs = {"unavailable_reason": classmethod(interrupt)} if where == "unavailable_reason" else \
        {"__init__": interrupt} if where == "constructor" else {}
    cls = backend_class("fake-ctrl-c", **attrs)
    fake_plugins(FakeEntryPoint("fake-ctrl-c", plugin("fake-ctrl-c", interrupt if where == "hook"
                                                      else lambda register: register(cls))))
    with pytest.raises(KeyboardInterrupt):
        get_backend("fake-ctrl-c")


def test_a_builtins_constructor_failure_names_only_the_backend(monkeypatch, no_env):
    def boom(self, dtype="float32"):
        raise OSError("no\n  memory")

    monkeypatch.setattr(NumpyBackend, "__init__", boom)
    with pytest.raises(registry.BackendError) as info:
        get_backend("numpy")
    assert str(info.value) == "backend 'numpy' failed to start: its constructor raised OSError: no memory"
    assert isinstance(info.value.__cause__, OSError)


def test_options_a_constructor_does_not_take_are_all_named(fake_plugins, no_env):
    def init(self, first, *rest, second=2):
        NumpyBackend.__init__(self)

    takes_two = backend_class("fake-two", __init__=init)
    takes_none = backend_class("fake-none", __init__=lambda self: NumpyBackend.__init__(self))
    fake_plugins(FakeEntryPoint("fake-two", plugin("fake-two", lambda register: (register(takes_two),
                                                                                  register(takes_none)))))
    with pytest.raises(BackendOptionError) as info:
        get_backend("fake-two:zeta=1", alpha=2, first=0)
    assert str(info.value) == "backend 'fake-two' has no option 'alpha', 'zeta' (its options: first, second)"
    with pytest.raises(BackendOptionError) as info:
        get_backend("fake-none", dtype="float32")
    assert str(info.value) == "backend 'fake-none' has no option 'dtype' (its options: none)"
    assert isinstance(get_backend("fake-two", first=1), takes_two)
    with pytest.raises(BackendOptionError) as info:  # `first` missing: the constructor's own TypeError
        get_backend("fake-two:second=3")
    assert str(info.value).startswith("backend 'fake-two' rejected its options {'second': 3}: ")
    assert isinstance(info.value.__cause__, TypeError)


def test_a_backend_named_by_a_long_non_string_shows_40_characters():
    with pytest.raises(TypeError) as info:
        get_backend(b"x" * 100)  # type: ignore[arg-type]
    assert str(info.value) == ("a backend is named by a str such as 'numpy' or 'numpy:dtype=float64', not "
                               f"bytes ({repr(b'x' * 100)[:40]})")


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_environment_variable_means_numpy(monkeypatch, value):
    monkeypatch.setenv("INFERNO_BACKEND", value)
    assert default_backend_name() == "numpy" and type(get_backend()) is NumpyBackend


def test_the_environment_variable_is_a_spec(monkeypatch):
    monkeypatch.setenv("INFERNO_BACKEND", "  array-api : dtype=float64 ")
    assert default_backend_name() == "array-api"
    be = get_backend()
    assert type(be) is ArrayApiBackend and be.dtype == np.float64


def test_an_entry_point_without_a_distribution_attribute(fake_plugins):
    class Bare:  # an entry-point-like object with no `dist` at all
        name, value = "fake-bare", "fake_bare"

        def load(self):
            raise ImportError("gone")

    fake_plugins(Bare())
    with pytest.warns(BackendPluginWarning, match="^inferno: backend plugin unknown distribution: failed "):
        info = {i.name: i for i in list_backends()}["fake-bare"]
    assert (info.origin, info.version) == ("unknown distribution", "")


def test_a_constructor_whose_signature_cannot_be_read_gets_the_options(fake_plugins, no_env):
    def init(self, **options):
        NumpyBackend.__init__(self)
        self.options = options

    init.__signature__ = 42  # inspect.signature raises TypeError on it
    opaque = backend_class("fake-opaque", __init__=init)
    fake_plugins(FakeEntryPoint("fake-opaque", plugin("fake-opaque", lambda register: register(opaque))))
    be = get_backend("fake-opaque:alpha=1", beta="x")
    assert type(be) is opaque and be.options == {"alpha": 1, "beta": "x"}


def test_close_names_are_those_at_least_half_alike():
    # "nux" has 2 of its 3 letters in common with "numpy": similarity 2 * 2 / (3 + 5) = 0.5, just enough.
    assert str(UnknownBackendError("nux", ["numpy", "torch"])).startswith(
        "unknown backend 'nux'. Did you mean 'numpy'? Known backends: numpy, torch")
    assert "Did you mean" not in str(UnknownBackendError("nxx", ["numpy", "torch"]))  # 0.25


def test_registering_an_instance_or_a_nameless_class_is_reported_under_the_entry_point(fake_plugins):
    instance = backend_class("fake-inst")()
    nameless = type("Nameless", (), {})
    fake_plugins(
        FakeEntryPoint("fake-instance", plugin("fake-instance", lambda register: register(instance))),
        FakeEntryPoint("fake-nameless", plugin("fake-nameless", lambda register: register(nameless))))
    with pytest.warns(BackendPluginWarning):
        infos = {i.name: i for i in list_backends()}
    assert "fake-inst" not in infos
    assert infos["fake-instance"].status == f"registered {instance!r}, which is not a Backend subclass"
    assert infos["fake-nameless"].status == f"registered {nameless!r}, which is not a Backend subclass"
