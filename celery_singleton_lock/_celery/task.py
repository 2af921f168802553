"""``LockedTask``: a thin class of hooks (as Celery's ``contrib/abortable.py``), each handing
its part of a task's life to the class's mode (:mod:`.modes`): ``apply_async`` (publish-time
dedup must not send, and a signal receiver cannot veto a publish), ``__call__`` and ``retry``
(:mod:`.run`), the worker's ``Request`` (:mod:`.worker`), ``after_return`` (a safety net).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, ClassVar

from celery import Task, states

from .._errors import RateLimited
from .._lock import LockKeys, LockSpace, RateReply
from . import wiring
from .config import LockConfig
from .locking import TaskLocking
from .modes import PublishMode
from .options import LockOptions
from .run import current_run, retry_keeping_lock, run_locked
from .worker import LOCKED_REQUEST, with_locked_request

log_release = logging.getLogger("celery_singleton_lock.release")


class LockedTask(Task):  # type: ignore[misc]  # celery ships no type information
    """A Celery task that never runs twice at once for the same arguments.

    The options (``lock_at``, ``lock_limit``, ``lock_cooldown``, ``lock_debounce``, ...; see the
    options table) are decorator keywords or class attributes, checked when the class is made:
    a wrong value, a combination that makes no sense or a misspelt ``lock_*`` name raises,
    naming the task and the option.

    A run-time duplicate (``lock_on_locked="skip"``, the default) never runs its body: it ends
    ``SKIPPED``, with ``{"holder", "lock", "reason"}`` as its result's ``info``. ``SKIPPED`` is
    not one of Celery's ready states, so ``.get()`` on its id waits out its timeout (for ever
    without one): read ``.state`` and follow ``.info["holder"]`` instead.

    Inside a run, ``self.lock`` is the held :class:`ReentrantLock` (with ``lock_limit`` above
    1, the slot the run holds; ``None`` when none). A subclass may override the extension
    points :meth:`key_prefix`, :meth:`queue_lease` and :meth:`key_encoder` (the drop-ins of
    :mod:`celery_singleton_lock.compat` do).
    """

    #: the worker's request class (a task class's own ``Request`` is composed with it)
    Request: ClassVar[Any] = LOCKED_REQUEST

    #: the class's options as validated, and how it makes lock names
    locking: ClassVar[TaskLocking]

    #: the ``__call__`` after ``LockedTask``'s in the MRO, ``None`` for Celery's own
    next_call: ClassVar[Callable[..., Any] | None] = None

    #: a subclass's own ``lock_*`` names that are not options (a compat shim's ``lock_expiry``),
    #: kept out of the misspelt-option check
    own_lock_attributes: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        key_func = cls.__dict__.get("lock_key")
        if inspect.isfunction(key_func):
            # a plain function as a class attribute would be bound to the task
            cls.lock_key = staticmethod(key_func)
        cls.locking = TaskLocking.of_class(cls, LockedTask)
        # The lock holds around the whole __call__ chain: a __call__ before ours in the MRO
        # that calls self.run itself (Flask's documented base class) is wrapped to take it
        # first; the next one after ours is found once, here.
        call = cls.__call__
        if call is not LockedTask.__call__ and not getattr(call, _LOCKING_CALL, False):
            cls.__call__ = _locking_call(call)  # type: ignore[method-assign]
        after = cls.__mro__[cls.__mro__.index(LockedTask) + 1 :]
        klass = next(k for k in after if "__call__" in vars(k))
        cls.next_call = None if klass is Task else vars(klass)["__call__"]
        for klass in cls.__mro__:  # a Request of a class other than ours and Task's
            own = None if klass in (LockedTask, Task) else vars(klass).get("Request")
            if own is not None:
                if not getattr(own, "composes_locked_request", False):  # not composed already
                    cls.Request = with_locked_request(own, cls.__qualname__)
                break

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """A locked task bound to an app needs the worker's receivers: connected now (once)."""
        wiring.connect()
        super().on_bound(app)

    @classmethod
    def key_prefix(cls, app: Any) -> str:
        """The prefix of this class's lock keys under ``app``: ``singleton_lock_prefix``. An
        override must give the same in every process; asked once per app config."""
        return LockConfig.of(app).prefix

    @classmethod
    def queue_lease(cls, app: Any) -> float:
        """Seconds a hold lasts while its message waits (taken at publish, or parked for a
        retry): ``lock_queue_ttl``, else ``singleton_lock_queue_ttl``. Asked for each hold."""
        ttl = cls.locking.options.lock_queue_ttl
        return LockConfig.of(app).queue_ttl if ttl is None else ttl

    @classmethod
    def key_encoder(cls) -> type[json.JSONEncoder] | None:
        """A JSON encoder class that writes a call's arguments for its lock name (what it refuses
        in the canonical form); ``None``: the canonical form alone. Asked for every name made
        without ``lock_key``, on the publisher and the worker alike."""
        return None

    def rate_limit_pause(self, exc: BaseException) -> float | None:
        """Seconds to pause this task's ``lock_rate`` limiter, for every worker, when the body
        raised ``exc`` (``None``: not a rate limit, the run fails as usual): a
        :class:`RateLimited`'s ``retry_after``; override it to map a client library's "too many
        requests" error (with its ``Retry-After``)."""
        return exc.retry_after if isinstance(exc, RateLimited) else None

    @classmethod
    def lock_space(cls, app: Any) -> LockSpace:
        """This class's locks under ``app``: the app's lock client, under :meth:`key_prefix`."""
        return cls.locking.space(app)

    def _lock_name(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        return self.locking.lock_name(self.name, args, kwargs)

    def lock_key_for(self, *args: Any, **kwargs: Any) -> str:
        """The Redis key of the lock these arguments take (``prefix:{task:digest}``)."""
        app = self._get_app()
        LockConfig.of(app).check()  # no client needed, but a wrong setting still raises
        return LockKeys.for_name(self.key_prefix(app), self._lock_name(args, kwargs)).lock

    def is_locked(self, *args: Any, **kwargs: Any) -> bool:
        """Whether a run (or a queued publish, or a cooldown) of this job holds its lock now:
        any of its ``lock_limit`` slots, or with ``lock_at="queue"`` its queued lock."""
        return any(
            s.held for s in self.locking.states(self._get_app(), self._lock_name(args, kwargs))
        )

    def lock_holder(self, *args: Any, **kwargs: Any) -> str | None:
        """The task id that holds this job's lock, or ``None`` (a running one before a queued
        one; with ``lock_limit`` above 1, the first slot's holder)."""
        states = self.locking.states(self._get_app(), self._lock_name(args, kwargs))
        return next((s.holder for s in states if s.held), None)

    def release_lock(self, *args: Any, **kwargs: Any) -> bool:
        """An operator's **force release** of this job's lock, whoever holds it: every
        ``lock_limit`` slot, its queued lock with ``lock_at="queue"``, a cooldown; waiters are
        woken. A run that holds it goes on unlocked (its heartbeat logs the lease as lost), and
        a duplicate may start beside it. Not for a task's own code. Logged at WARNING on
        ``celery_singleton_lock.release``. Returns whether a lock was released."""
        name = self._lock_name(args, kwargs)  # first: arguments that do not fit raise
        app = self._get_app()
        space = self.locking.space(app)
        held = [s for s in self.locking.states(app, name) if s.held]
        released = [s for s in held if space.force_release(s.keys.lock)]
        if released:
            log_release.warning(
                "release_lock: force-released %d lock(s) of %s %s held by %s (a run still "
                "inside goes on unlocked)",
                len(released),
                self.name,
                name,
                ", ".join(sorted({s.holder or "-" for s in released})),
            )
        return bool(released)

    @property
    def rate_turn(self) -> RateReply | None:
        """Inside a run of a task with ``lock_rate``: its limiter's reply (``at``: the start as
        the limiter counted it, on Redis's clock; ``used``: starts in the window so far)."""
        run = current_run(self.request)
        return None if run is None or run.turn is None else run.turn.reply

    @property
    def lock(self) -> Any:
        """Inside a run: the held :class:`ReentrantLock` (``None`` when this run holds none)."""
        run = current_run(self.request)
        return None if run is None else run.held_lock

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        def send(new_id: str | None, opts: dict[str, Any]) -> Any:
            return super(LockedTask, self).apply_async(
                args, kwargs, new_id, producer, link, link_error, shadow, **opts
            )

        mode = self.locking.mode  # a run-time lock takes nothing at publish
        if not isinstance(mode, PublishMode) or self._get_app().conf.task_always_eager:
            return send(task_id, options)
        callbacks = bool(link or link_error or options.get("chain") or options.get("chord"))
        return mode.publish(self, send, args, kwargs, task_id, options, callbacks)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        run = current_run(request)
        if run is None:
            # when the body comes next, run_locked marks it started without a second lookup
            body_next = type(self).next_call is None
            call = self.run if body_next else self._call_past_locked_task
            return run_locked(self, request, args, kwargs, call, body_is_run=body_next)
        if not run.body_started:
            # the run's own __call__ chain on its way to the body (a base class's wrapped
            # __call__ before this one in the MRO took the lock)
            return self._call_past_locked_task(*args, **kwargs)
        return super().__call__(*args, **kwargs)  # the task called inside its own body

    def _call_past_locked_task(self, *args: Any, **kwargs: Any) -> Any:
        """The next ``__call__`` in the MRO, or the body itself where that is Celery's
        ``Task.__call__``: it would push a bare copy of the request the worker pushed (the
        worker's stack protection skips it too), and ``self.request`` must stay the Context the
        run's state is kept for."""
        call = type(self).next_call
        if call is None:
            run = current_run(self.request)
            if run is not None:
                run.body_started = True
            return self.run(*args, **kwargs)
        return call(self, *args, **kwargs)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        def send_retry() -> Any:
            return super(LockedTask, self).retry(
                args, kwargs, exc, throw, eta, countdown, max_retries, **options
            )

        return retry_keeping_lock(self, send_retry, eta, countdown, max_retries)

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # a safety net: __call__ has released on every path that returns here
        run = current_run(self.request)
        if run is not None:
            run.finish(f"after_return {status}", failed=status != states.SUCCESS)
        super().after_return(status, retval, task_id, args, kwargs, einfo)


#: a ``__call__`` that takes the lock before the one it wraps runs
_LOCKING_CALL = "_singleton_lock_wraps_call"


def _locking_call(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def __call__(self: LockedTask, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly or current_run(request) is not None:
            return call(self, *args, **kwargs)
        return run_locked(self, request, args, kwargs, lambda *a, **kw: call(self, *a, **kw))

    setattr(__call__, _LOCKING_CALL, True)
    return __call__


# the options' class attributes, which a subclass (or a decorator keyword) overrides
for _option in fields(LockOptions):
    setattr(LockedTask, _option.name, _option.default)
del _option
LockedTask.locking = TaskLocking(LockOptions(), None, task_class=LockedTask)
