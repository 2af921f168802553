"""What an operator's command acts on: the Redis client and the key prefixes, from ``--url``
and ``--prefix`` or from the Celery app (``celery -A proj locks ...``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import click

from .._celery.config import LockConfig
from .._celery.task import LockedTask
from .._errors import LockError

url_option = click.option(
    "--url", default=None, help="Redis URL (default: the Celery app's settings)"
)
prefix_option = click.option(
    "--prefix",
    default=None,
    help="key prefix (default: every prefix of the app's locked tasks; with --url: lock)",
)


@contextlib.contextmanager
def target(
    ctx: click.Context, url: str | None, prefix: str | None
) -> Iterator[tuple[Any, list[str]]]:
    """The Redis client and the prefixes to act on; a lock error or a wrong setting ends the
    command with its message, not a traceback."""
    try:
        if url:
            import redis

            client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
            yield client, [prefix or "lock"]
            return
        app = getattr(ctx.obj, "app", None)
        if app is None:
            raise click.UsageError(
                "give --url redis://host:port/db, or run as `celery -A proj locks`"
            )
        try:
            client = LockConfig.of(app).client
        except (TypeError, ValueError) as exc:  # a wrong setting
            raise click.ClickException(str(exc)) from exc
        yield client, [prefix] if prefix else app_prefixes(app)
    except LockError as exc:
        raise click.ClickException(str(exc)) from exc


def app_prefixes(app: Any) -> list[str]:
    """The app's prefix, then the others its locked tasks use (a drop-in's own)."""
    try:
        app.loader.import_default_modules()  # the task modules a worker of the app imports
    except Exception as exc:  # an operator's command goes on with the tasks it has
        click.echo(f"warning: the app's task modules failed to import: {exc}", err=True)
    prefixes = [LockConfig.of(app).prefix]
    for task in list(app.tasks.values()):
        prefix = task.key_prefix(app) if isinstance(task, LockedTask) else prefixes[0]
        if prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes
