"""``LockedTask``: run-time singletons and publish-time dedup for Celery tasks.

Where each part of a task's life is handled, and why there (Celery facts, from its source):

* publish: :meth:`LockedTask.apply_async`. Signal receivers cannot veto a publish (their
  exceptions are swallowed), so the dedup that must *not send* lives here.
* run: :meth:`LockedTask.__call__` takes the lock before the body and releases it as the body
  returns, *before* the worker stores the result: a caller who has seen the result and
  publishes the same job again gets a new run. The lock's owner is the task id, so the
  publish-time hold is re-entered by its own run.
* retry: :meth:`LockedTask.retry` parks the hold (kept in Redis, not renewed, lease long enough
  for the countdown) *before* the retry message is sent, so the retry re-enters it and no
  duplicate slips in meanwhile.
* pool child killed, hard time limit, revoke: the worker's main process releases
  (:mod:`._request` and the ``task_revoked`` receiver below), without waiting for the lease.
* :meth:`LockedTask.after_return`: an idempotent safety net.

Per-run state lives on ``self.request`` (one Context per run), never on the task instance,
which serves every run in a process.
"""

from __future__ import annotations

import difflib
import inspect
import json
import logging
import os
import socket
import uuid
import weakref
from collections.abc import Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, ClassVar

from celery import Task, signals, states
from celery.exceptions import Ignore, MaxRetriesExceededError, Retry
from redis.exceptions import WatchError

from . import _backend, _scripts
from ._errors import AlreadyQueuedError, LockBackendError, TaskLockedError
from ._keys import LockKeys, check_prefix
from ._lock import ReentrantLock
from ._options import OPTION_NAMES, LockOptions, validate_options
from ._owner import new_request_id
from ._settings import MisconfiguredError, get_client, setting
from ._taskkey import task_lock_name

__all__ = ["HEADER", "SKIPPED", "LockedTask", "release_for_request"]

log_publish = logging.getLogger("celery_singleton_lock.publish")
log_run = logging.getLogger("celery_singleton_lock.run")
log_release = logging.getLogger("celery_singleton_lock.release")

#: message header that carries the lock name from the publisher to the worker
HEADER = "singleton_lock"
#: the state a skipped duplicate records (not a ready state: .get() on it waits)
SKIPPED = "SKIPPED"
#: per-run state, by the run's request Context (not an attribute of it: Celery copies a
#: Context's attributes into the retry message)
_runs: weakref.WeakKeyDictionary[Any, _Run] = weakref.WeakKeyDictionary()

_HOST = socket.gethostname()


def _run_signature(cls: type) -> inspect.Signature | None:
    """The signature the task's arguments bind to, without ``self`` of a bound task."""
    run = inspect.getattr_static(cls, "run", None)
    if run is None:
        return None
    bound = not isinstance(run, staticmethod)
    func = run.__func__ if isinstance(run, (staticmethod, classmethod)) else run
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    if bound:
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    return sig


_HOST_JSON = _json_str(_HOST)


def _info(task_name: str, task_id: str, state: str) -> str:
    """The operator info of a hold: ``json.dumps({"task", "id", "state", "host", "pid"},
    separators=(",", ":"))``, spelled out (every publish and run writes one; this is about
    five times cheaper than building a JSON encoder for it)."""
    if not (type(task_name) is str and type(task_id) is str and type(state) is str):
        return json.dumps(
            {"task": task_name, "id": task_id, "state": state, "host": _HOST, "pid": os.getpid()},
            separators=(",", ":"),
        )
    return (
        f'{{"task":{_json_str(task_name)},"id":{_json_str(task_id)},'
        f'"state":{_json_str(state)},"host":{_HOST_JSON},"pid":{os.getpid()}}}'
    )


def _seconds_until(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        now = datetime.now(value.tzinfo or UTC)
        if value.tzinfo is None:
            now = now.replace(tzinfo=None)
        return (value - now).total_seconds()
    if isinstance(value, str):
        try:
            return _seconds_until(datetime.fromisoformat(value))
        except ValueError:
            return None
    return None


class _Run:
    """One run's lock state, kept on the run's request Context."""

    __slots__ = ("finished", "keys", "lock", "parked", "task")

    def __init__(self, task: LockedTask, lock: ReentrantLock, keys: LockKeys) -> None:
        self.task = task
        self.lock = lock
        self.keys = keys
        self.finished = False
        self.parked = False

    def finish(self, why: str) -> None:
        """Release every hold of the task id (its run's and its publish's). Idempotent."""
        if self.finished or self.parked:
            return
        self.finished = True
        try:
            left = self.lock._release_all()
        except LockBackendError as exc:
            log_release.error(
                "could not release %s after %s (%s); it frees itself when its lease ends",
                self.keys.lock,
                why,
                exc,
            )
            return
        if left < 0:
            log_release.warning(
                "the lock %s of task %s was lost during its run (lease expired or force-released)",
                self.keys.lock,
                self.lock.owner,
            )

    def park(self, delay: float) -> None:
        lease = max(delay, 0.0) + self.task._queue_ttl()
        try:
            kept = self.lock._park(
                round(lease * 1000), _info(self.task.name, self.lock.owner, "queued")
            )
        except LockBackendError as exc:
            log_release.error("could not keep %s for the retry: %s", self.keys.lock, exc)
            kept = False
        self.parked = True
        if not kept:
            log_release.warning(
                "the lock %s was lost before the retry of task %s was queued",
                self.keys.lock,
                self.lock.owner,
            )

    def unpark(self) -> None:
        """The retry was not sent after all: take the hold back for the rest of the run."""
        if not self.parked:
            return
        self.parked = False
        try:
            self.lock.acquire(blocking=False)
        except Exception as exc:  # the run goes on; its finish releases what is held
            log_release.warning("could not take %s back: %s", self.keys.lock, exc)


class LockedTask(Task):  # type: ignore[misc]  # celery ships no type information
    """A Celery task that never runs twice at once for the same arguments.

    Options (decorator keywords or class attributes), see the README / SPEC §4:
    ``lock_at`` ("run" | "publish"), ``lock_release_on_start``, ``lock_unique_on``,
    ``lock_key``, ``lock_ttl``, ``lock_queue_ttl``, ``lock_on_duplicate`` ("return" |
    "raise"), ``lock_on_locked`` ("skip" | "retry" | "raise" | "wait"),
    ``lock_wait_timeout``, ``lock_retry_countdown``.

    Inside a run, ``self.lock`` is the held :class:`ReentrantLock` (``None`` when none).
    """

    Request = "celery_singleton_lock._request:LockedRequest"

    lock_at: ClassVar[str] = "run"
    lock_release_on_start: ClassVar[bool] = False
    lock_unique_on: ClassVar[Sequence[str] | None] = None
    lock_key: ClassVar[Any] = None
    lock_ttl: ClassVar[float | None] = None
    lock_queue_ttl: ClassVar[float | None] = None
    lock_on_duplicate: ClassVar[str] = "return"
    lock_on_locked: ClassVar[str] = "skip"
    lock_wait_timeout: ClassVar[float] = 10.0
    lock_retry_countdown: ClassVar[float | None] = None

    _lock_options: ClassVar[LockOptions] = LockOptions()
    _lock_signature: ClassVar[inspect.Signature | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        key_func = cls.__dict__.get("lock_key")
        if inspect.isfunction(key_func):
            # A plain function as a class attribute would be bound to the task: keep it plain.
            cls.lock_key = staticmethod(key_func)
        raw = {}
        for name in OPTION_NAMES:
            value = inspect.getattr_static(cls, name)
            if isinstance(value, staticmethod):
                value = value.__func__
            if value is not inspect.getattr_static(LockedTask, name):
                raw[name] = value
        cls._lock_signature = _run_signature(cls)
        name = cls.__dict__.get("name") or cls.__qualname__
        typos = [
            attr
            for attr in cls.__dict__
            if attr.startswith("lock_") and not hasattr(LockedTask, attr)
        ]
        if typos:
            # Celery turns every decorator keyword into a class attribute: a misspelt option
            # would otherwise be ignored in silence.
            named = []
            for typo in typos:
                close = difflib.get_close_matches(typo, OPTION_NAMES, 1)
                named.append(typo + (f" (did you mean {close[0]}?)" if close else ""))
            raise TypeError(
                f"task {name!r}: unknown lock option(s) {', '.join(named)}; "
                f"the options are {', '.join(OPTION_NAMES)}"
            )
        cls._lock_options = validate_options(str(name), raw, cls._lock_signature)

    # -- keys and settings ---------------------------------------------------------------------

    def _prefix(self) -> str:
        prefix = setting(self._get_app(), "singleton_lock_prefix")
        return check_prefix(prefix, "singleton_lock_prefix")

    def _ttl(self) -> float:
        return float(self._lock_options.lock_ttl or setting(self._get_app(), "singleton_lock_ttl"))

    def _queue_ttl(self) -> float:
        return float(
            self._lock_options.lock_queue_ttl
            or setting(self._get_app(), "singleton_lock_queue_ttl")
        )

    def _client(self) -> Any:
        return get_client(self._get_app())

    def _lock_name(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> str:
        opts = self._lock_options
        return task_lock_name(
            self.name,
            self._lock_signature,
            args,
            kwargs,
            unique_on=opts.lock_unique_on,
            key_func=opts.lock_key,
        )

    def _keys_for(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> LockKeys:
        return LockKeys.for_name(self._prefix(), self._lock_name(args, kwargs))

    def lock_key_for(self, *args: Any, **kwargs: Any) -> str:
        """The Redis key of the lock these arguments take (``prefix:{task:digest}``)."""
        return self._keys_for(args, kwargs).lock

    def is_locked(self, *args: Any, **kwargs: Any) -> bool:
        """Whether a run (or a queued publish) of this job holds its lock now."""
        keys = self._keys_for(args, kwargs)
        with _backend.backend_errors("check", keys.name):
            return bool(self._client().exists(keys.lock))

    def lock_holder(self, *args: Any, **kwargs: Any) -> str | None:
        """The task id that holds this job's lock, or ``None``."""
        return _backend.inspect(self._client(), self._keys_for(args, kwargs)).holder

    def release_lock(self, *args: Any, **kwargs: Any) -> bool:
        """Operator's force release of this job's lock, whoever holds it; wakes waiters.
        Returns whether a lock was released."""
        return _backend.force_release(self._client(), self._keys_for(args, kwargs))

    @property
    def lock(self) -> ReentrantLock | None:
        """Inside a run: the held lock (``None`` when this run holds none)."""
        run = _runs.get(self.request)
        if run is None or run.finished or run.parked:
            return None
        return run.lock

    def _backend_error(self, what: str, exc: LockBackendError) -> bool:
        """Whether to go on without the lock (``singleton_lock_on_backend_error="proceed"``)."""
        policy = setting(self._get_app(), "singleton_lock_on_backend_error")
        if isinstance(exc, MisconfiguredError):
            return False  # a missing setting is not an outage: "proceed" must not hide it
        if policy == "proceed":
            logging.getLogger(f"celery_singleton_lock.{what}").error(
                "Redis failed for the lock of task %s; going on WITHOUT the lock "
                "(singleton_lock_on_backend_error='proceed'): %s",
                self.name,
                exc,
            )
            return True
        if policy != "raise":
            raise ValueError(
                f"singleton_lock_on_backend_error must be 'raise' or 'proceed', got {policy!r}"
            ) from exc
        return False

    # -- publish -------------------------------------------------------------------------------

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
        opts = self._lock_options
        app = self._get_app()
        if opts.lock_at != "publish" or app.conf.task_always_eager:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        task_id = task_id or str(uuid.uuid4())
        keys = self._keys_for(args, kwargs)
        expires = _seconds_until(options.get("expires"))
        if expires is not None:
            lease = max(expires, 1.0)
        else:
            delay = _seconds_until(options.get("eta")) or options.get("countdown") or 0.0
            lease = max(float(delay), 0.0) + self._queue_ttl()
        info = _info(self.name, task_id, "queued")
        try:
            client = self._client()
            reply = _backend.acquire(
                client, keys, task_id, round(lease * 1000), new_request_id(), info
            )
            if not reply.acquired and _free_revoked_holder(self, client, keys, reply.holder):
                reply = _backend.acquire(
                    client, keys, task_id, round(lease * 1000), new_request_id(), info
                )
        except LockBackendError as exc:
            if self._backend_error("publish", exc):
                # The header marks the message as handled here (the publish receiver of
                # install() must not try, and log, a second time); it names the lock only.
                headers = dict(options.get("headers") or {})
                headers[HEADER] = keys.name
                options["headers"] = headers
                return super().apply_async(
                    args, kwargs, task_id, producer, link, link_error, shadow, **options
                )
            raise
        if not reply.acquired and task_id == self.request.id:
            # The retry of a run that holds no lock (a duplicate retrying with
            # lock_on_locked="retry"): it must be sent, or the job would be lost.
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        if not reply.acquired:
            ttl = max(reply.pttl, 0) / 1000
            log_publish.info(
                "not publishing %s: a duplicate of task %s, which holds %s (%.1f s left)",
                self.name,
                reply.holder,
                keys.lock,
                ttl,
            )
            if opts.lock_on_duplicate == "raise":
                raise AlreadyQueuedError(reply.holder, ttl, keys.lock)
            if link or link_error or options.get("chain") or options.get("chord"):
                log_publish.warning(
                    "%s was not published (a duplicate of task %s), and with it its callbacks "
                    "(link, chain or chord members after it) were not sent either",
                    self.name,
                    reply.holder,
                )
            return self.AsyncResult(reply.holder)
        headers = dict(options.get("headers") or {})
        headers[HEADER] = keys.name
        options["headers"] = headers
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        except BaseException:
            # Nothing was sent: do not keep a lock for a message that does not exist.
            try:
                _backend.release(client, keys, task_id, 1)
            except LockBackendError as exc:
                log_publish.error("could not undo the publish lock %s: %s", keys.lock, exc)
            raise

    # -- run -----------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly or _runs.get(request) is not None:
            # A plain function call (or a nested call of the task inside its own run).
            return super().__call__(*args, **kwargs)
        run = self._enter(request, args, kwargs)
        # The worker has pushed this run's request already; Task.__call__ would push a copy
        # (Celery's stack protection skips it the same way), and self.request must stay the
        # Context that the run's state is kept for.
        if run is None:
            return self.run(*args, **kwargs)
        try:
            result = self.run(*args, **kwargs)
        except Retry:
            if not run.parked:  # a Retry raised by hand, without self.retry()
                run.park(0.0)
            raise
        except BaseException as exc:
            run.finish(type(exc).__name__)
            raise
        # Released here, before the worker stores the result.
        run.finish("success")
        return result

    def _enter(self, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> _Run | None:
        opts = self._lock_options
        header = request.get(HEADER) if hasattr(request, "get") else None
        name = header if isinstance(header, str) and header else self._lock_name(args, kwargs)
        keys = LockKeys.for_name(self._prefix(), name)
        task_id = request.id
        try:
            client = self._client()
            if opts.lock_at == "publish" and opts.lock_release_on_start:
                _backend.release(client, keys, task_id, 0)
                return None
            lock = ReentrantLock(
                client,
                name,
                ttl=self._ttl(),
                owner=task_id,
                renew=True,
                prefix=keys.prefix,
                info=_info(self.name, task_id, "running"),
            )
            # unique per delivery: the process's random token and a counter (cheaper than uuid4)
            lock._run = new_request_id()
            acquired = lock.acquire(blocking=False)
            refused = lock.last_refusal
            # A holder revoked while queued will never let go by itself: free it.
            if (
                not acquired
                and refused is not None
                and not refused.other_run
                and _free_revoked_holder(self, client, keys, refused.holder)
            ):
                acquired = lock.acquire(blocking=False)
            if not acquired and opts.lock_on_locked == "wait":
                acquired = lock.acquire(blocking=True, timeout=opts.lock_wait_timeout)
        except LockBackendError as exc:
            if self._backend_error("run", exc):
                return None
            raise
        if acquired:
            run = _Run(self, lock, keys)
            _runs[request] = run
            return run
        refusal = lock.last_refusal
        assert refusal is not None
        if refusal.other_run:
            log_run.warning(
                "not running %s[%s]: this message was delivered again while its first run is "
                "still alive (it holds %s); dropping this delivery",
                self.name,
                task_id,
                keys.lock,
            )
            raise Ignore()
        self._locked_out(request, keys, refusal.holder, max(refusal.pttl, 0) / 1000)
        return None  # not reached: _locked_out always raises

    def _locked_out(self, request: Any, keys: LockKeys, holder: str, ttl: float) -> None:
        opts = self._lock_options
        if opts.lock_on_locked == "raise":
            raise TaskLockedError(holder, keys.lock)
        if opts.lock_on_locked == "retry":
            countdown = opts.lock_retry_countdown or max(ttl, 0.1)
            try:
                raise self.retry(countdown=countdown)
            except MaxRetriesExceededError:
                log_run.info(
                    "%s[%s] ran out of retries waiting for lock %s",
                    self.name,
                    request.id,
                    keys.lock,
                )
        self._skip(request, keys, holder)

    def _skip(self, request: Any, keys: LockKeys, holder: str) -> None:
        log_run.info(
            "skipped %s[%s]: lock %s is held by task %s",
            self.name,
            request.id,
            keys.lock,
            holder,
        )
        if not request.is_eager:
            with suppress(NotImplementedError):  # no result backend configured
                self.backend.store_result(
                    request.id,
                    {"holder": holder, "lock": keys.lock, "reason": "locked"},
                    SKIPPED,
                    request=request,
                )
        raise Ignore()

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
        run = _runs.get(self.request)
        limit = self.max_retries if max_retries is None else max_retries
        exhausted = limit is not None and self.request.retries + 1 > limit
        if run is None or run.finished or run.parked or exhausted:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        if eta is not None:
            delay = _seconds_until(eta) or 0.0
        else:
            delay = self.default_retry_delay if countdown is None else countdown
        # Park before the retry message exists: a fast worker may start the retry at once.
        run.park(float(delay or 0.0))
        try:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        except Retry:
            raise
        except BaseException:
            run.unpark()
            raise

    def after_return(
        self,
        status: str,
        retval: Any,
        task_id: str,
        args: Any,
        kwargs: Any,
        einfo: Any,
    ) -> None:
        # Safety net only: __call__ has released already on every path that returns here.
        run = _runs.get(self.request)
        if run is not None:
            run.finish(f"after_return {status}")
        super().after_return(status, retval, task_id, args, kwargs, einfo)


def _queued_by(info: Any, holder: str) -> bool:
    """Whether a lock's operator info says ``holder`` holds it from the queue (publish or
    parked retry), not from a run."""
    try:
        data = json.loads(_backend.text(info))
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("state") == "queued" and data.get("id") == holder


def _free_revoked_holder(task: LockedTask, client: Any, keys: LockKeys, holder: str) -> bool:
    """Free the queue hold of a task that was revoked while its message waited.

    Celery marks a queued task REVOKED the moment the revoke is broadcast, but the hold taken
    at its publish (or kept for its retry) is released only when a worker reaches the message
    (the main process's ``task_revoked``), which can be much later, or never. Until then a
    caller who has seen REVOKED and publishes the job again would be handed the revoked task's
    result, and a run-time duplicate would be skipped for a holder that will not run (SPEC §5
    rows 4 and 5). So a duplicate that finds such a holder frees it: only a hold that no run
    has entered (no run token, info "queued"), only when the holder's state is REVOKED, and
    atomically (WATCH), so a run that starts meanwhile keeps its lock. One extra read on a
    refused acquire; on any error the duplicate is handled as before."""
    if not holder:
        return False
    try:
        run, info = client.hmget(keys.meta, "run", "info")
        if run or not _queued_by(info, holder):
            return False
        if task.backend.get_state(holder) != states.REVOKED:
            return False
        _scripts.FORCE_RELEASE.load(client)
        with client.pipeline(transaction=True) as pipe:
            pipe.watch(keys.lock, keys.meta)
            run, info = pipe.hmget(keys.meta, "run", "info")
            if run or not _queued_by(info, holder):
                return False
            pipe.multi()
            _scripts.FORCE_RELEASE.queue(
                pipe, keys.pair, (keys.channel, _backend.META_RETENTION_MS, holder)
            )
            (done,) = pipe.execute()
    except WatchError:  # the lock changed meanwhile (a run of the holder started, or it ended)
        return False
    except Exception as exc:
        log_release.debug("not freeing %s of revoked task %s: %r", keys.lock, holder, exc)
        return False
    if int(done):
        log_release.info(
            "released %s: its holder, task %s, was revoked while queued", keys.lock, holder
        )
    return bool(int(done))


def release_for_request(
    task: Any,
    task_id: str,
    args: Any,
    kwargs: Any,
    header: Any,
    why: str,
    requeued: bool = False,
) -> None:
    """Release every hold of ``task_id`` on its job's lock, from the worker's main process
    (its pool child died, hit the hard time limit, or the task was revoked).

    ``requeued``: the message goes back to the queue (``reject_on_worker_lost``): the hold is
    parked for its redelivery instead (kept, not renewed, run token cleared), so the
    redelivered run re-enters it at once and no duplicate gets in meanwhile."""
    if not isinstance(task, LockedTask):
        return
    try:
        name = header if isinstance(header, str) and header else task._lock_name(args, kwargs)
        keys = LockKeys.for_name(task._prefix(), name)
        if requeued:
            lease_ms = round(task._queue_ttl() * 1000)
            info = _info(task.name, task_id, "queued")
            if _backend.park(task._client(), keys, task_id, lease_ms, info):
                log_release.info(
                    "kept %s of %s[%s] for its redelivery after %s",
                    keys.lock,
                    task.name,
                    task_id,
                    why,
                )
            return
        left = _backend.release(task._client(), keys, task_id, 0)
    except Exception as exc:
        log_release.error(
            "could not release the lock of %s[%s] after %s: %s; it frees itself when its "
            "lease ends",
            getattr(task, "name", task),
            task_id,
            why,
            exc,
        )
        return
    if left == 0:
        log_release.info("released %s of %s[%s] after %s", keys.lock, task.name, task_id, why)


def _on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    if request is None or not isinstance(sender, LockedTask):
        return
    release_for_request(
        sender,
        request.id,
        request.args,
        request.kwargs,
        request.get(HEADER) if hasattr(request, "get") else None,
        "revoke" + (" (terminated)" if kwargs.get("terminated") else ""),
    )


signals.task_revoked.connect(
    _on_task_revoked, weak=False, dispatch_uid="celery_singleton_lock.revoked"
)
