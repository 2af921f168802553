"""Per-task lock options: their one definition (a field of :class:`LockOptions` each: name,
default, the README's description, check), and their validation. ``LockedTask``'s attributes,
the misspelt-option check and the README's options table are made from it.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, TypeVar

from .._lock import Rate, check_duration
from .combinations import check_combination

Check = Callable[[str, str, Any], Any]
T = TypeVar("T")


def _choice(*choices: str) -> Check:
    def check(task: str, name: str, value: object) -> str:
        if value not in choices:
            raise ValueError(
                f"task {task!r}: {name} must be one of {', '.join(map(repr, choices))}, "
                f"got {value!r}"
            )
        return str(value)

    return check


def _flag(task: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"task {task!r}: {name} must be True or False")
    return value


def _seconds(**how: Any) -> Check:
    def check(task: str, name: str, value: object) -> Any:
        if value is None and "none_means" in how:
            return None
        return check_duration(value, f"task {task!r}: {name}", **how)

    return check


_seconds_or_default = _seconds(none_means="the default")
_no_cooldown_or_seconds = _seconds(none_means="none")


def _permits_or_none(task: str, name: str, value: object) -> int | None:
    if value is None:
        return None  # lock_rate alone (checked with the other options)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"task {task!r}: {name} must be a whole number of runs at once such as 3 (or None: "
            f"no limit, with lock_rate), got {value!r}"
        )
    if value < 1:
        raise ValueError(
            f"task {task!r}: {name} must be at least 1 (1: one run at a time), got {value}"
        )
    return value


def _rate(task: str, name: str, value: object) -> Rate | Callable[..., Any] | None:
    if value is None or callable(value):
        return value  # a callable's answer is checked for each call, before Redis
    if not isinstance(value, str | Rate):
        raise TypeError(
            f"task {task!r}: {name} must be 'N/period' such as '10/s', '100/m' or '5/10s', or a "
            f"callable(*args, **kwargs) returning one, got {value!r}"
        )
    return Rate.parse(value, f"task {task!r}: {name}")


def _rate_key(task: str, name: str, value: object) -> str | Callable[..., str] | None:
    if value is None or callable(value):
        return value
    if not isinstance(value, str) or not value:
        raise TypeError(
            f"task {task!r}: {name} must be a limiter name such as 'partner-api' (shared by "
            f"every task that names it), or a callable(*args, **kwargs) -> str, got {value!r}"
        )
    return value


def _names(task: str, name: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(n, str) for n in value):
        raise TypeError(f"task {task!r}: {name} must be a list of parameter names, got {value!r}")
    return tuple(value)


def _callable_or_none(task: str, name: str, value: object) -> Callable[..., str] | None:
    if value is not None and not callable(value):
        raise TypeError(
            f"task {task!r}: {name} must be a callable(*args, **kwargs) -> str, got {value!r}"
        )
    return value


def _option(default: T, shown: str, doc: str, check: Check) -> T:
    """A field: its default, the default as the README shows it, its meaning, its check."""
    return field(default=default, metadata={"shown": shown, "doc": doc, "check": check})


@dataclass(frozen=True)
class LockOptions:
    """One task's validated options (decorator keywords or class attributes of the task)."""

    lock_at: str = _option(
        "run",
        '`"run"`',
        '`"run"`: held while the task runs. `"publish"`: taken at publish, held through the '
        'end of the run. `"queue"`: one copy queued and one running; the queued copy starts '
        "when the running one ends (it waits without a pool process, never skipped)",
        _choice("run", "publish", "queue"),
    )
    lock_limit: int | None = _option(
        1,
        "`1` (`None` with `lock_rate` alone)",
        "how many runs of one key may hold it at once (each holds one of `lock_limit` "
        "leased slots); over the limit `lock_on_locked` applies. `None`: no limit on runs "
        "at once, only `lock_rate` (the default when `lock_rate` is set with no `lock_at`, "
        "`lock_limit`, `lock_cooldown` or `lock_debounce`)",
        _permits_or_none,
    )
    lock_rate: Rate | Callable[..., Any] | None = _option(  # noqa: RUF009 (a field())
        None,
        "`None`",
        'at most N *starts* per period per key, across every worker: `"10/s"`, `"100/m"`, '
        '`"5/10s"`; exact over any window of that length, on Redis\'s clock; or a '
        "`callable(*args, **kwargs)` returning one (a limit by plan). A call over the limit "
        "comes back when its turn comes, not counted against `max_retries`",
        _rate,
    )
    lock_rate_key: str | Callable[..., str] | None = _option(  # noqa: RUF009 (a field())
        None,
        "the job's key",
        "which calls share a `lock_rate` limiter: a name several tasks share (one partner "
        "API), or a `callable(*args, **kwargs) -> str` (per customer or tenant)",
        _rate_key,
    )
    lock_rate_max_delay: float = _option(
        3600.0,
        "`3600` s",
        "with `lock_rate`: the longest a call waits for its turn, counted from its first "
        "refusal; past it `lock_on_locked` applies (`0`: at once)",
        _seconds(include_minimum=True),
    )
    lock_cooldown: float | None = _option(
        None,
        "`None`",
        "seconds the key stays taken after a run ends: a duplicate in that window is "
        'handled as one of a running job (`lock_on_locked`; with `"publish"`, the last '
        "job is returned)",
        _no_cooldown_or_seconds,
    )
    lock_cooldown_on_failure: bool = _option(
        True,
        "`True`",
        "with `lock_cooldown`: a run that failed (raised, hit its hard time limit, or its "
        "pool process was killed) starts the cooldown too; `False`: only a run that "
        "returned does (a whole worker killed starts none: its lock ends with its lease)",
        _flag,
    )
    lock_debounce: float | None = _option(
        None,
        "`None`",
        'with `"publish"` or `"queue"`: each call is sent to run this many seconds later, '
        "and a call within that time replaces the one still waiting (the replaced one is "
        "skipped when it arrives; the call returns the job that will run); a call's own "
        "`countdown=` or `eta=` replaces this delay for that call",
        _no_cooldown_or_seconds,
    )
    lock_release_on_start: bool = _option(
        False,
        "`False`",
        'with `"publish"`: released when the run starts (dedups the queue only)',
        _flag,
    )
    lock_unique_on: tuple[str, ...] | None = _option(
        None, "all parameters", "parameter names that make up the key", _names
    )
    lock_key: Callable[..., str] | None = _option(  # noqa: RUF009 (a field())
        None,
        "`None`",
        "`callable(*args, **kwargs) -> str` that replaces the argument part of the key",
        _callable_or_none,
    )
    lock_ttl: float | None = _option(
        None, "`singleton_lock_ttl`", "lease of this task's running lock", _seconds_or_default
    )
    lock_queue_ttl: float | None = _option(
        None,
        "`singleton_lock_queue_ttl`",
        "lease of this task's publish-time lock while its message waits",
        _seconds_or_default,
    )
    lock_on_duplicate: str = _option(
        "return",
        '`"return"`',
        'publish-time duplicate: `"return"` the holder\'s `AsyncResult`, or `"raise"` '
        "`AlreadyQueuedError(task_id, ttl)`",
        _choice("return", "raise"),
    )
    lock_on_locked: str = _option(
        "skip",
        '`"skip"`',
        'run-time duplicate: `"skip"` (it ends `SKIPPED` with the holder in `.info`; not a '
        "ready state, so `.get()` on its id waits out its timeout: read `.state`), "
        '`"retry"`, `"raise"` `TaskLockedError(task_id)`, or `"wait"`',
        _choice("skip", "retry", "raise", "wait"),
    )
    lock_wait_timeout: float = _option(
        10.0,
        "`10` s",
        'for `"wait"`: block up to this long, then skip (with `"queue"`: then wait for '
        "the run's end without a pool process)",
        _seconds(),
    )
    lock_retry_countdown: float | None = _option(
        None,
        "1 s, 2 s, 4 s, … with jitter, capped by the holder's remaining lease",
        'for `"retry"`: the countdown of each retry (a fixed number replaces the growing '
        "backoff); these retries count against `max_retries` (Celery's default of 3 covers "
        "3.5 to 7 s of backoff), and when they run out the duplicate ends `SKIPPED` "
        '(with `"queue"`: the countdown of the queued copy\'s fallback, by default the '
        "holder's remaining lease, which the run's end makes moot; these do not count: a "
        "queued copy is never dropped)",
        _seconds_or_default,
    )


_FIELDS: tuple[Field[Any], ...] = fields(LockOptions)
#: every option's name, in the order of the definition
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in _FIELDS)


def check_option_names(
    task: str, names: Iterable[str], known: Collection[str] = OPTION_NAMES
) -> None:
    """``TypeError`` naming every name in ``names`` that is not an option, with the closest
    option as a suggestion: a misspelt option must never be ignored in silence."""
    unknown = sorted(set(names) - set(known))
    if not unknown:
        return
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(known), 1)
        named.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    raise TypeError(
        f"task {task!r}: unknown lock option(s) {', '.join(named)}; "
        f"the options are {', '.join(known)}"
    )


def validate_options(
    task: str, raw: Mapping[str, Any], signature: inspect.Signature | None = None
) -> LockOptions:
    """Check every option and return them; the error names the task and the option."""
    check_option_names(task, raw)
    values = {
        f.name: f.metadata["check"](task, f.name, raw[f.name]) for f in _FIELDS if f.name in raw
    }
    options = LockOptions(**values)
    if options.lock_unique_on is not None and signature is not None:
        params = signature.parameters
        has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        missing = [n for n in options.lock_unique_on if n not in params and not has_var_kw]
        if missing:
            raise ValueError(
                f"task {task!r}: lock_unique_on names {missing} that are not parameters "
                f"of the task; its parameters are {list(params)}"
            )
    if (
        options.lock_rate is not None
        and "lock_limit" not in raw
        and options.lock_at == "run"
        and options.lock_cooldown is None
    ):
        # lock_rate alone limits starts, not runs at once: every call runs in its turn
        options = replace(options, lock_limit=None)
    check_combination(task, options, raw)
    return options


def options_table() -> str:
    """The README's options table (Markdown), made from the definition."""
    rows = ["| option | default | meaning |", "| --- | --- | --- |"]
    for f in _FIELDS:
        rows.append(f"| `{f.name}` | {f.metadata['shown']} | {f.metadata['doc']} |")
    return "\n".join(rows)
