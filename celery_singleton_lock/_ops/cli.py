"""``celery -A proj locks ...`` and ``python -m celery_singleton_lock --url URL ...``.

Sub-commands: ``list`` (every held lock), ``show KEY`` (one lock), ``release KEY`` (force
release), ``purge`` (force-release all, or those matching ``--match``). ``--json`` prints
machine-readable output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from .._celery.install import connect_command_hooks
from . import locks as ops

__all__ = ["locks", "main"]

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


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _table(views: Sequence[ops.LockView]) -> str:
    rows = [[title for _, title in _COLUMNS]]
    rows += [[_cell(getattr(v, field)) for field, _ in _COLUMNS] for v in views]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)


def _client_from(ctx: click.Context, url: str | None) -> tuple[Any, str]:
    obj = ctx.obj
    app = getattr(obj, "app", None) if obj is not None else None
    if url:
        import redis

        return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5), "lock"
    if app is None:
        raise click.UsageError("give --url redis://host:port/db, or run as `celery -A proj locks`")
    from .._celery.config import LockConfig

    config = LockConfig.of(app)
    return config.client, config.prefix


def _run(ctx: click.Context, action: str, url: str | None, prefix: str | None, **kw: Any) -> None:
    from .._errors import LockError

    try:
        client, default_prefix = _client_from(ctx, url)
        prefix = prefix or default_prefix
        as_json = kw.pop("as_json", False)
        if action == "list":
            views = ops.find_locks(client, prefix, kw["match"])
            if as_json:
                click.echo(json.dumps([v.as_dict() for v in views], indent=2))
            elif views:
                click.echo(_table(views))
            else:
                click.echo(f"no locks held under prefix {prefix!r}")
        elif action == "show":
            view = ops.show(client, kw["key"], prefix)
            if as_json:
                click.echo(json.dumps(view.as_dict() if view else None, indent=2))
            elif view is None:
                click.echo(f"{kw['key']}: not held")
            else:
                for field, title in _COLUMNS:
                    click.echo(f"{title:>8}: {_cell(getattr(view, field))}")
        elif action == "release":
            holder = kw.get("holder") or ""
            done = ops.release(client, kw["key"], prefix, holder)
            current = None if done else ops.show(client, kw["key"], prefix)
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "key": kw["key"],
                            "released": done,
                            "holder": current.holder if current else None,
                        }
                    )
                )
            elif done:
                click.echo(f"{kw['key']}: released")
            elif current is None:
                click.echo(f"{kw['key']}: was not held")
            if not done and current is not None:
                # Only --holder can leave a held lock in place: say who holds it, and fail.
                raise click.ClickException(
                    f"{kw['key']}: held by {current.holder}, not {holder}; not released"
                )
        elif action == "purge":
            which = "queued lock (no run entered)" if kw["queued"] else "lock"
            if not kw["yes"]:
                click.confirm(
                    f"force-release every {which} under {prefix!r} matching {kw['match']!r}? "
                    "(locks only: no message is touched)",
                    abort=True,
                )
            count = ops.purge(client, prefix, kw["match"], queued_only=kw["queued"])
            if as_json:
                click.echo(json.dumps({"released": count}))
            else:
                click.echo(f"released {count} lock(s)")
    except LockError as exc:
        raise click.ClickException(str(exc)) from exc


_url = click.option("--url", default=None, help="Redis URL (default: the Celery app's settings)")
_prefix = click.option(
    "--prefix",
    default=None,
    help="key prefix (default: the app's singleton_lock_prefix; with --url: lock)",
)
_json = click.option("--json", "as_json", is_flag=True, help="machine-readable output")
_match = click.option("--match", default="*", show_default=True, help="glob on the lock name")


@click.group(name="locks")
def locks() -> None:
    """Inspect and release celery-singleton-lock locks."""


@locks.command(name="list")
@_url
@_prefix
@_json
@_match
@click.pass_context
def list_(
    ctx: click.Context, url: str | None, prefix: str | None, as_json: bool, match: str
) -> None:
    """Every held lock: key, task, holder, host, pid, state, age, lease, fence, holds, slots.

    HOLDS is the holder's hold count in Redis: a lock_at="publish" job shows 2 while it runs
    (its message's hold and its run's, one job), 1 while queued. STATE "cooldown" is a job
    that ended and cools down (lock_cooldown): LEASE is the cooldown left. SLOTS, for a job
    with a lock_limit above 1, is how many of its slots are held out of the limit (one row
    per slot held)."""
    _run(ctx, "list", url, prefix, as_json=as_json, match=match)


@locks.command()
@click.argument("key")
@_url
@_prefix
@_json
@click.pass_context
def show(ctx: click.Context, key: str, url: str | None, prefix: str | None, as_json: bool) -> None:
    """One lock, by key (prefix:{name}) or name."""
    _run(ctx, "show", url, prefix, as_json=as_json, key=key)


@locks.command()
@click.argument("key")
@click.option("--holder", default=None, help="only if this task id holds it")
@_url
@_prefix
@_json
@click.pass_context
def release(
    ctx: click.Context,
    key: str,
    holder: str | None,
    url: str | None,
    prefix: str | None,
    as_json: bool,
) -> None:
    """Force-release one lock (waiters are woken; the fencing token keeps increasing)."""
    _run(ctx, "release", url, prefix, as_json=as_json, key=key, holder=holder)


@locks.command()
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option(
    "--queued",
    is_flag=True,
    help="only locks held for queued messages that no run has entered (after `celery purge`)",
)
@_match
@_url
@_prefix
@_json
@click.pass_context
def purge(
    ctx: click.Context,
    yes: bool,
    queued: bool,
    match: str,
    url: str | None,
    prefix: str | None,
    as_json: bool,
) -> None:
    """Force-release every lock under the prefix (or those matching --match).

    Locks only: unlike Celery's own `celery purge`, no message is removed from any queue. After
    `celery purge` emptied a queue, `locks purge --queued` frees the publish-time locks of the
    messages it removed (they would otherwise hold their jobs for singleton_lock_queue_ttl)."""
    _run(ctx, "purge", url, prefix, as_json=as_json, yes=yes, match=match, queued=queued)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m celery_singleton_lock --url URL list|show|release|purge``."""
    args = list(sys.argv[1:] if argv is None else argv)
    # Accept the URL before the sub-command too: move it after.
    if args and args[0] == "--url" and len(args) > 2:
        args = [*args[2:3], "--url", args[1], *args[3:]]
    elif args and args[0].startswith("--url="):
        args = [*args[1:2], args[0], *args[2:]]
    locks.main(args=args, prog_name="python -m celery_singleton_lock")


# The `celery` command imports this module for its `locks` command (an entry point: for every
# `celery ...` run). What that changes, and only at a worker's or beat's start: the settings are
# checked, and the `singleton_lock_tasks` setting's tasks are locked without an install() call.
connect_command_hooks()
