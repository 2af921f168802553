"""The package as a whole: its layers, one definition of each option and setting, its public
names.

- The lock layer (``celery_singleton_lock._lock``) never imports Celery, checked twice: in its
  source, and by importing it in a process where Celery cannot be imported.
- Outside the lock layer, nothing imports its modules: only what ``_lock/__init__.py`` exports
  (the scripts, the commands, the client's runtime stay inside).
- The README's options and settings tables are made from their one definition.
- Importing the package changes nothing in Celery (no signal gets a receiver), and no module of
  the package imports, through others, the module that imports it (no import cycle).
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import textwrap
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from lock_helpers import START_TIMEOUT

import celery_singleton_lock
import celery_singleton_lock.lock
from celery_singleton_lock import LockBackendError, LockedTask, LockError, MisconfiguredError
from celery_singleton_lock._celery.options import OPTION_NAMES, options_table
from celery_singleton_lock._celery.settings import settings_table

PACKAGE = Path(celery_singleton_lock.__file__).resolve().parent
ROOT = PACKAGE.parent
LOCK_LAYER = PACKAGE / "_lock"
CELERY_DISTRIBUTIONS = {"celery", "kombu", "billiard"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _import_statements(path: Path) -> list[tuple[int, str, list[str]]]:
    """Every import statement of ``path``: its line, the module (relative imports resolved)
    and the names taken from it (none for ``import x``)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base, [alias.name for alias in node.names]))
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (relative imports resolved), with its line number."""
    found = []
    for line, module, names in _import_statements(path):
        found.append((line, module))
        # `from . import x` imports the module x, when x is a module
        found += [(line, f"{module}.{name}") for name in names if _is_module(f"{module}.{name}")]
    return found


def test_the_lock_layer_never_imports_celery_in_its_source() -> None:
    modules = sorted(LOCK_LAYER.glob("*.py"))
    assert len(modules) >= 10
    offending = [
        f"{path.name}:{line}: {name}"
        for path in modules
        for line, name in _imports(path)
        if name.split(".")[0] in CELERY_DISTRIBUTIONS
        or (name.startswith("celery_singleton_lock.") and not _inside_lock_layer(name))
    ]
    assert offending == []


def _inside_lock_layer(name: str) -> bool:
    # the lock layer may use the shared exceptions, and itself
    return name.startswith(("celery_singleton_lock._lock", "celery_singleton_lock._errors"))


def test_the_lock_layer_imports_where_celery_cannot_be_imported() -> None:
    code = textwrap.dedent(
        """
        import importlib.abc, importlib.util, sys

        class NoCelery(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("celery", "kombu", "billiard"):
                    raise ImportError(f"the lock layer imported {name}")
                return None

        sys.meta_path.insert(0, NoCelery())
        # The package's own __init__ imports the Celery layer: stand in for it, so that only
        # the lock layer (and the exceptions it shares) is imported.
        spec = importlib.util.spec_from_file_location(
            "celery_singleton_lock",
            sys.argv[1] + "/__init__.py",
            submodule_search_locations=[sys.argv[1]],
        )
        sys.modules["celery_singleton_lock"] = importlib.util.module_from_spec(spec)
        import celery_singleton_lock._lock as lock_layer
        from celery_singleton_lock._lock import runtime, wakeup  # every module loads
        assert not any(m.split(".")[0] in ("celery", "kombu", "billiard") for m in sys.modules)
        print("ok", len(lock_layer.__all__))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


def test_outside_the_lock_layer_only_its_api_is_imported() -> None:
    outside = [p for p in sorted(PACKAGE.rglob("*.py")) if LOCK_LAYER not in p.parents]
    assert len(outside) >= 15
    offending = [
        f"{path.relative_to(PACKAGE)}:{line}: {name}"
        for path in outside
        for line, name in _imports(path)
        if name.startswith("celery_singleton_lock._lock.")
    ]
    assert offending == []


def test_compat_uses_the_public_api_only() -> None:
    """The drop-ins are written as a user's code would be: from the package they import only
    names of ``celery_singleton_lock.__all__``, besides their own modules."""
    modules = sorted((PACKAGE / "compat").rglob("*.py"))
    assert len(modules) >= 5
    offending = []
    for path in modules:
        for line, module, names in _import_statements(path):
            where = f"{path.relative_to(PACKAGE)}:{line}"
            if module in ("celery_singleton_lock", "celery_singleton_lock.lock"):
                exports = import_module(module).__all__
                offending += [f"{where}: {name}" for name in sorted(set(names) - set(exports))]
            elif module.startswith("celery_singleton_lock.") and not module.startswith(
                "celery_singleton_lock.compat"
            ):
                offending.append(f"{where}: {module}")
    assert offending == []


def test_the_readme_tables_are_the_definitions() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert options_table() in readme
    assert settings_table() in readme


def test_each_option_is_a_class_attribute_with_its_default() -> None:
    for name in OPTION_NAMES:
        assert hasattr(LockedTask, name), name
    assert LockedTask.lock_at == "run" and LockedTask.lock_wait_timeout == 10.0


def test_a_misspelt_option_gets_one_check_with_a_suggestion_on_both_paths() -> None:
    app = Celery("pkg_typo", set_as_current=False)
    app.finalize()  # so that app.task makes the class now, not at first use

    def typo() -> None: ...

    with pytest.raises(TypeError, match=r"lock_on_lcked \(did you mean lock_on_locked\?\)"):
        app.task(base=LockedTask, name="pkg.typo", shared=False, lock_on_lcked="skip")(typo)
    from celery_singleton_lock import install

    with pytest.raises(TypeError, match=r"lock_on_lcked \(did you mean lock_on_locked\?\)"):
        install(app, tasks={"pkg.plain": {"lock_on_lcked": "skip"}})


@pytest.mark.parametrize(
    ("name", "value", "error", "says"),
    [
        ("singleton_lock_ttl", "30s", TypeError, "number of seconds"),
        ("singleton_lock_ttl", -1, ValueError, "> 0"),
        ("singleton_lock_queue_ttl", float("nan"), ValueError, "got nan"),
        ("singleton_lock_prefix", "a{b", ValueError, "must not contain"),
        ("singleton_lock_on_backend_error", "ignore", ValueError, "'raise' or 'proceed'"),
        ("singleton_lock_redis_options", ["x"], TypeError, "must be a dict"),
        ("singleton_lock_redis_url", "http://x", ValueError, "must be a Redis URL"),
        ("singleton_lock_client", "nope", TypeError, "redis-py client"),
        ("singleton_lock_tasks", ["x"], TypeError, "dict of {task name: options}"),
    ],
)
def test_a_wrong_setting_is_named_when_it_is_read(
    name: str, value: object, error: type[Exception], says: str
) -> None:
    app = Celery("pkg_settings", set_as_current=False)
    app.conf[name] = value
    app.finalize()  # so that app.task makes the class now

    def job() -> None: ...

    task = app.task(base=LockedTask, name="pkg.settings", shared=False)(job)
    with pytest.raises(error) as info:
        task.lock_key_for()  # the first use that checks the settings (no client needed)
    assert name in str(info.value) and says in str(info.value)


def test_a_wrong_setting_fails_the_first_publish_that_reads_it_and_sends_nothing() -> None:
    app = Celery("pkg_publish", set_as_current=False, broker="redis://127.0.0.1:1/0")
    app.conf.singleton_lock_queue_ttl = "1h"

    def job(x: int) -> None: ...

    task = app.task(base=LockedTask, name="pkg.publish", shared=False, lock_at="publish")(job)
    with pytest.raises(TypeError, match="singleton_lock_queue_ttl must be a number of seconds"):
        task.delay(1)  # before any connection: nothing answers on port 1


def test_misconfigured_error_is_public_and_not_a_backend_error() -> None:
    assert celery_singleton_lock.MisconfiguredError is MisconfiguredError
    assert "MisconfiguredError" in celery_singleton_lock.__all__
    assert MisconfiguredError.__module__ == "celery_singleton_lock._errors"
    # a setting to fix is no outage: an `except LockBackendError` must not swallow it
    assert issubclass(MisconfiguredError, LockError)
    assert not issubclass(MisconfiguredError, LockBackendError)
    assert not issubclass(LockBackendError, MisconfiguredError)


def test_every_error_is_a_lock_error_and_exported() -> None:
    from celery_singleton_lock import _errors

    for name in _errors.__all__:
        error = getattr(_errors, name)
        # RateLimited is raised by a task's body, to the package: not a lock's failure
        assert issubclass(error, LockError) or name == "RateLimited", name
        assert getattr(celery_singleton_lock, name) is error, name
        assert name in celery_singleton_lock.__all__, name


def test_all_is_sorted_and_importable() -> None:
    names = celery_singleton_lock.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(celery_singleton_lock, name), name


def _package_classes_in(annotation: str, module: str) -> list[type]:
    """The classes of this package that a (string) annotation names, resolved in ``module``."""
    found = []
    for dotted in re.findall(r"[A-Za-z_][\w.]*", annotation):
        first, *rest = dotted.split(".")
        target: Any = vars(sys.modules[module]).get(first)
        for part in rest:
            target = getattr(target, part, None)
        if inspect.isclass(target) and target.__module__.startswith("celery_singleton_lock."):
            found.append(target)
    return found


def _types_returned_by(cls: type) -> list[type]:
    """The package's classes that a public method or property of ``cls`` returns, and those of
    a reply's fields (a NamedTuple's)."""
    found: list[type] = []
    # getmembers_static: no descriptor runs (a Celery task class's `app` would bind the class)
    for name, member in inspect.getmembers_static(cls):
        if name.startswith("_"):
            continue
        function = member.fget if isinstance(member, property) else member
        function = getattr(function, "__func__", function)
        if not inspect.isfunction(function) or not function.__module__.startswith(
            "celery_singleton_lock."
        ):
            continue
        returns = function.__annotations__.get("return")
        if isinstance(returns, str):
            found += _package_classes_in(returns, function.__module__)
    if hasattr(cls, "_fields"):
        for annotation in cls.__annotations__.values():
            if isinstance(annotation, str):
                found += _package_classes_in(annotation, cls.__module__)
    return found


def _exported(cls: type) -> bool:
    """Importable by its name from the package, or from its lock module."""
    return any(
        getattr(module, cls.__name__, None) is cls and cls.__name__ in module.__all__
        for module in (celery_singleton_lock, celery_singleton_lock.lock)
    )


def test_every_type_a_public_method_returns_is_exported() -> None:
    """From the package, or (the lock's typed replies and states) from its ``lock`` module;
    the package's own exports stay few (the lock module has the rest)."""
    public = [getattr(celery_singleton_lock, name) for name in celery_singleton_lock.__all__]
    public += [
        getattr(celery_singleton_lock.lock, name) for name in celery_singleton_lock.lock.__all__
    ]
    todo = [obj for obj in public if inspect.isclass(obj)]
    seen: set[type] = set()
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo += _types_returned_by(cls)
    assert sorted(cls.__name__ for cls in seen if not _exported(cls)) == []
    # the lock layer's replies and its space are among them
    for name in ("AcquireReply", "ReleaseReply", "LockState", "LockSpace", "LockKeys"):
        assert name in celery_singleton_lock.lock.__all__, name
    assert len(celery_singleton_lock.__all__) <= 24


def test_the_version_comes_from_the_package_metadata() -> None:
    assert celery_singleton_lock.__version__ == version("celery-singleton-lock")


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of ``if TYPE_CHECKING:`` blocks (imports there never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at import time or in a function: a cycle
    dodged by a late import is still a cycle), the parents of a module left out (Python has
    imported them before the module runs)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        skipped = _type_checking_lines(ast.parse(path.read_text(encoding="utf-8")))
        targets = {
            name
            for line, name in _imports(path)
            if line not in skipped
            and name.startswith("celery_singleton_lock")
            and _is_module(name)
            and not module.startswith(name + ".")
            and name != module
        }
        # `from .x import y` of a package x names its __init__; keep the most specific modules
        graph[module] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
    return graph


def test_the_package_has_no_import_cycle() -> None:
    graph = _import_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_importing_the_package_connects_no_celery_receiver() -> None:
    """In a fresh interpreter: every Celery signal's receivers before and after importing the
    package and every module of it that a user imports (compat's drop-ins, beat, metrics, the
    testing helpers), and loading its ``celery.commands`` entry point as the ``celery`` command
    does for every run; a LockedTask made and bound to an app is what connects them."""
    code = textwrap.dedent(
        """
        import importlib
        from importlib.metadata import entry_points
        from celery import Celery, signals
        from celery.utils.dispatch import Signal

        def receivers():
            return {
                name: len(signal.receivers)
                for name, signal in vars(signals).items()
                if isinstance(signal, Signal)
            }

        before = receivers()
        for module in (
            "celery_singleton_lock",
            "celery_singleton_lock.beat",
            "celery_singleton_lock.compat.singleton",
            "celery_singleton_lock.compat.once",
            "celery_singleton_lock.metrics",
            "celery_singleton_lock.testing",
        ):
            importlib.import_module(module)
        commands = [
            ep.load()
            for ep in entry_points(group="celery.commands")
            if ep.dist is not None and ep.dist.name == "celery-singleton-lock"
        ]
        assert [c.name for c in commands] == ["locks"], commands
        after = receivers()
        print(sorted(name for name in after if after[name] != before[name]))
        from celery_singleton_lock import LockedTask
        app = Celery("made")

        def job(x):
            return x

        app.task(base=LockedTask)(job)
        app.finalize()
        made = receivers()
        print(sorted(name for name in made if made[name] != before[name]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    imported, made = done.stdout.splitlines()
    assert imported == "[]"
    assert "task_revoked" in made and "worker_init" in made  # a locked task connects them


# -- which tests may import a private module -------------------------------------------------

#: the lock layer's own white-box tests (and their helpers): they test the insides of
#: ``celery_singleton_lock._lock`` (its scripts, keys, runtime, heartbeat) and may import them;
#: with them the scripts the Celery layer runs on a lock's keys (``test_lock_waiters.py``)
LOCK_WHITE_BOX = frozenset(
    {
        "lock_helpers.py",
        "test_faults_lock.py",
        "test_lock_basic.py",
        "test_lock_cluster_migration.py",
        "test_lock_contention.py",
        "test_lock_deployments.py",
        "test_lock_faults.py",
        "test_lock_heartbeat.py",
        "test_lock_holes.py",
        "test_lock_hot_paths.py",
        "test_lock_model.py",
        "test_lock_packaging.py",
        "test_lock_rate.py",
        "test_lock_runtime.py",
        "test_lock_semaphore.py",
        "test_lock_waiters.py",
    }
)

#: the tests that check the package against its own definitions, not as a user sees it: each
#: may import the private modules it checks, for the reason given
DEFINITIONS_WHITE_BOX = {
    "test_package.py": "the package's import rules and exports; the README tables' definitions",
    "test_docs.py": "the docs' tables, header names, key limits, log lines against the code's",
    "test_lifecycle.py": "docs/lifecycle.md's table is the one the code takes its states from",
    "test_settings_definitions.py": "LockConfig's values where the first lock refuses the app; "
    "the plain-arguments text before it is hashed",
}

_PRIVATE_IMPORT = re.compile(
    r"^\s*(?:from celery_singleton_lock(?:\.\w+)*\._\w*|import celery_singleton_lock(?:\.\w+)*\._"
    r"|from celery_singleton_lock(?:\.\w+)* import _)",
    re.M,
)


def test_tests_import_private_modules_only_where_listed() -> None:
    """A test reaches the package through its public names, as a user does; the lock layer's
    white-box tests and the checks of the package's own definitions are the exceptions."""
    tests = ROOT / "tests"
    found = {
        path.relative_to(tests).as_posix()
        for path in tests.rglob("*.py")
        if _PRIVATE_IMPORT.search(path.read_text(encoding="utf-8"))
    }
    allowed = LOCK_WHITE_BOX | DEFINITIONS_WHITE_BOX.keys()
    assert found <= allowed, sorted(found - allowed)
