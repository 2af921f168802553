"""``celery -A proj locks ...`` and ``python -m celery_singleton_lock --url URL ...``: ``list``,
``show KEY``, ``release KEY`` (a force release) and ``purge``; ``--json`` for machines."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from .._lock import LockSpace, RateKeys, RateLimiter
from . import locks as ops
from .target import prefix_option, target, url_option

_COLUMNS = (
    ("key", "KEY"),
    ("task", "TASK"),
    ("holder", "HOLDER"),
    ("host", "HOST"),
    ("pid", "PID"),
    ("state", "STATE"),
    ("age_s", "AGE s"),
    ("lease_s", "LEASE s"),
    ("fence", "FENCE"),
    ("hold_count", "HOLDS"),
    ("slots", "SLOTS"),
)

_LIMITER_COLUMNS = (
    ("key", "LIMITER"),
    ("used", "USED"),
    ("rule", "LIMIT"),
    ("waiting", "WAITING"),
    ("next_free", "NEXT FREE s"),
    ("paused", "PAUSED s"),
)


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def _table(views: Sequence[Any], columns: Sequence[tuple[str, str]] = _COLUMNS) -> str:
    """``views`` (dataclasses, or dicts) as a table of ``columns``."""
    rows = [[title for _, title in columns]]
    for view in views:
        row = view if isinstance(view, dict) else vars(view)
        rows.append([_cell(row[field]) for field, _ in columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)


def _locate(client: Any, key: str, prefixes: list[str]) -> str:
    """The prefix of ``key`` (a lock key's own; a name's: the first prefix holding it)."""
    for prefix in prefixes:
        if key.startswith(f"{prefix}:{{"):
            return prefix
    return next((p for p in prefixes if ops.show(client, key, p)), prefixes[0])


_json = click.option("--json", "as_json", is_flag=True, help="machine-readable output")
_match = click.option("--match", default="*", show_default=True, help="glob on the lock name")
_key = click.argument("key")


class _Locks(click.Group):
    """Imports ``web`` when asked for: it needs the ``web`` extra, and ``celery`` imports this
    module on every run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), "web"})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "web" and "web" not in self.commands:
            try:
                from ..web import serve
            except ImportError as exc:
                message = str(exc)

                # whatever its options: the missing extra is what to say
                @click.command(
                    name="web",
                    help="Serve a web page of the locks.",
                    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                )
                def web() -> None:
                    raise click.ClickException(message)

                return web
            return serve.web
        return super().get_command(ctx, cmd_name)


@click.group(name="locks", cls=_Locks)
def locks() -> None:
    """Inspect and release celery-singleton-lock locks."""


def _command(*options: Any, name: str | None = None) -> Callable[[Callable[..., None]], Any]:
    """A sub-command with ``options``, ``--url``, ``--prefix`` and ``--json``: ``body`` gets the
    Redis client, the prefixes, ``as_json`` and its own options."""

    def make(body: Callable[..., None]) -> Any:
        @functools.wraps(body)
        def command(url: str | None, prefix: str | None, as_json: bool, **own: Any) -> None:
            with target(click.get_current_context(), url, prefix) as (client, prefixes):
                body(client, prefixes, as_json, **own)

        for option in reversed((*options, url_option, prefix_option, _json)):
            command = option(command)
        return locks.command(name=name)(command)

    return make


@_command(_match, name="list")
def list_(client: Any, prefixes: list[str], as_json: bool, match: str) -> None:
    """Every held lock: key, task, holder, host, pid, state, age, lease, fence, holds, slots.

    HOLDS is the holder's hold count in Redis: a lock_at="publish" job shows 2 while it runs
    (its message's hold and its run's, one job), 1 while queued. STATE "cooldown" is a job
    that ended and cools down (lock_cooldown): LEASE is the cooldown left. SLOTS, for a job
    with a lock_limit above 1, is how many of its slots are held out of the limit (one row
    per slot held).

    Then every lock_rate limiter in use, by key (`release KEY` resets one): USED is the
    starts in its window out of its limit, WAITING the calls with a turn reserved, NEXT FREE
    the seconds until a new call would start, PAUSED the pause left after a body raised
    RateLimited. --json gives one list: locks ("kind": "lock"), then limiters
    ("kind": "limiter")."""
    views = [view for p in prefixes for view in ops.find_locks(client, p, match)]
    limiters = [
        ops.limiter_row(r, p) for p in prefixes for r in ops.find_limiters(client, p, match)
    ]
    if as_json:
        click.echo(json.dumps([v.as_dict() for v in views] + limiters, indent=2))
        return
    if views:
        click.echo(_table(views))
    else:
        click.echo(f"no locks held under prefix {', '.join(map(repr, prefixes))}")
    if limiters:
        click.echo("")
        click.echo(_table(limiters, _LIMITER_COLUMNS))


@_command(_key)
def show(client: Any, prefixes: list[str], as_json: bool, key: str) -> None:
    """One lock, by key (prefix:{name}) or name."""
    view = ops.show(client, key, _locate(client, key, prefixes))
    if as_json:
        click.echo(json.dumps(view.as_dict() if view else None, indent=2))
    elif view is None:
        click.echo(f"{key}: not held")
    else:
        for field, title in _COLUMNS:
            click.echo(f"{title:>8}: {_cell(getattr(view, field))}")


@_command(_key, click.option("--holder", default=None, help="only if this task id holds it"))
def release(client: Any, prefixes: list[str], as_json: bool, key: str, holder: str | None) -> None:
    """Force-release one lock (waiters are woken; the fencing token keeps increasing), or reset
    one rate limiter given by its key (prefix:rate:{name}: its starts, turns and pause are
    forgotten)."""
    limiter = next(filter(None, (RateKeys.from_key(p, key) for p in prefixes)), None)
    if limiter is not None:
        done = RateLimiter(client, limiter.name, "1/s", prefix=limiter.prefix).reset()
        if as_json:
            click.echo(json.dumps({"key": key, "reset": done}))
        else:
            click.echo(f"{key}: reset" if done else f"{key}: was not in use")
        return
    where = _locate(client, key, prefixes)
    done = LockSpace(client, where).force_release(key, holder=holder)
    current = None if done else ops.show(client, key, where)
    if as_json:
        click.echo(json.dumps({"key": key, "released": done, "holder": current and current.holder}))
    elif done:
        click.echo(f"{key}: released")
    elif current is None:
        click.echo(f"{key}: was not held")
    if current is not None:  # only --holder leaves a held lock: say who holds it, and fail
        raise click.ClickException(f"{key}: held by {current.holder}, not {holder}; not released")


@_command(
    click.option("--yes", is_flag=True, help="do not ask for confirmation"),
    click.option(
        "--queued",
        is_flag=True,
        help="only locks held for queued messages that no run has entered (after `celery purge`)",
    ),
    _match,
)
def purge(
    client: Any, prefixes: list[str], as_json: bool, yes: bool, queued: bool, match: str
) -> None:
    """Force-release every lock under the prefix (or those matching --match).

    Locks only: unlike Celery's own `celery purge`, no message is removed from any queue. After
    `celery purge` emptied a queue, `locks purge --queued` frees the publish-time locks of the
    messages it removed (they would otherwise hold their jobs for singleton_lock_queue_ttl)."""
    if not yes:
        which = "queued lock (no run entered)" if queued else "lock"
        click.confirm(
            f"force-release every {which} under {', '.join(map(repr, prefixes))} matching "
            f"{match!r}? (locks only: no message is touched)",
            abort=True,
        )
    count = sum(ops.purge(client, p, match, queued_only=queued) for p in prefixes)
    click.echo(json.dumps({"released": count}) if as_json else f"released {count} lock(s)")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m celery_singleton_lock --url URL list|show|release|purge``."""
    args = list(sys.argv[1:] if argv is None else argv)
    # The URL may come before the sub-command too: move it after.
    if args and args[0] == "--url" and len(args) > 2:
        args = [*args[2:3], "--url", args[1], *args[3:]]
    elif args and args[0].startswith("--url="):
        args = [*args[1:2], args[0], *args[2:]]
    locks.main(args=args, prog_name="python -m celery_singleton_lock")
