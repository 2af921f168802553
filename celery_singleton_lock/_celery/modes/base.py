"""``lock_at="run"``, and what every mode shares: the run takes its job's lock (with
``lock_limit`` above 1, one of its leased slots) before the body and lets it go as the body
returns; a duplicate that reaches a worker meanwhile is handled as ``lock_on_locked`` says.

A mode is made once per task class, with the class's options and its parts (its cooldown, its
``lock_on_locked`` choice); :mod:`.publish` and :mod:`.queue` extend it. Its methods are the
job's life: ``enter`` (a run starts), ``yield_hold`` (a call waits for its ``lock_rate`` turn),
what a run's end or retry does (:mod:`..run`), and ``release_for`` (the worker's main process,
for a run whose pool process cannot).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any, ClassVar, NamedTuple, NoReturn

from celery import states
from celery.exceptions import Ignore

from ..._errors import LockBackendError
from ..._lock import (
    AcquireReply,
    NamedLock,
    RateLimiter,
    ReentrantLock,
    Semaphore,
    new_run_token,
)
from ..config import Bound
from ..conflict import Conflict, conflict_for
from ..hold import MessageLock, holder_info, release_if_in
from ..lifecycle import AT_COOLDOWN, AT_REDELIVERY, AT_RUN, REVOCABLE
from ..options import LockOptions
from ..parts import Cooldown, refusal_reason
from ..rate import TaskRate, Turn
from ..run import TaskRun

__all__ = ["Attempt", "Mode", "RunMode", "free_revoked_holder"]

log = logging.getLogger("celery_singleton_lock.run")
log_release = logging.getLogger("celery_singleton_lock.release")


class Attempt(NamedTuple):
    """A run taking its job's lock: what each step of its start is given."""

    task: Any
    request: Any
    bound: Bound
    #: the lock its message holds, or would hold
    message: str


class RunMode:
    """``lock_at="run"``: held while the task runs."""

    name: ClassVar[str] = "run"
    #: a publish takes a lock for its message
    at_publish: ClassVar[bool] = False

    def __init__(self, options: LockOptions) -> None:
        self.options = options
        #: ``False`` with ``lock_rate`` alone (``lock_limit=None``): a run takes no lock
        self.holds_lock = options.lock_limit is not None
        self.limit = options.lock_limit or 1
        self.conflict: Conflict = conflict_for(options)
        self.cooldown = (
            None
            if options.lock_cooldown is None
            else Cooldown(options.lock_cooldown, options.lock_cooldown_on_failure)
        )
        self.rate = None if options.lock_rate is None else TaskRate(options)

    # -- the job's locks --------------------------------------------------------------------

    @property
    def message_permits(self) -> int:
        """How many messages of one job may hold its message lock at once."""
        return 1

    def message_lock(self, name: str) -> str:
        """The lock a queued message of the job ``name`` holds (its publish takes it)."""
        return name

    def run_lock(self, message_lock: str) -> str:
        """The lock a run takes, from the lock its message holds."""
        return message_lock

    def job_of(self, at: Attempt) -> NamedLock:
        """The job's lock that the run of ``at`` takes, to act on in Redis."""
        return at.bound.space.named(self.run_lock(at.message), self.limit)

    def message_lock_of(
        self, task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str:
        """The lock this run's message holds or would hold: the one its headers name (its
        publish took it), else the one its arguments make."""
        lock = MessageLock.of(request)
        if lock is not None:
            return lock.name
        return self.message_lock(task.locking.lock_name(task.name, args, kwargs))

    # -- a run starts -----------------------------------------------------------------------

    def enter(
        self, task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskRun:
        """Take the job's lock for this run, or handle the run as a duplicate (raises)."""
        message = self.message_lock_of(task, request, args, kwargs)
        bound = task.locking.bound(task.app)
        try:
            return self.take(Attempt(task, request, bound, message))
        except LockBackendError as exc:
            if not bound.config.proceed_on_backend_error:
                raise
            log.error(
                "Redis failed for the lock of task %s; going on WITHOUT the lock "
                "(singleton_lock_on_backend_error='proceed'): %s",
                task.name,
                exc,
            )
            return TaskRun(task, None)

    def take(self, at: Attempt) -> TaskRun:
        task, request, bound, message = at
        name = self.run_lock(message)
        # The call's limiter first: a lock_rate or lock_rate_key callable that fails does so
        # before anything is written.
        limiter = None
        if self.rate is not None:
            limiter = self.rate.limiter(task, bound, name, request.args, request.kwargs)
        if not self.holds_lock:  # lock_rate alone: no lock, the limiter only
            assert limiter is not None, "lock_limit=None is refused without lock_rate"
            run = TaskRun(task, None)
            run.turn, run.start = self.admit(at, None, limiter), (at.bound, at.message)
            return run
        lock = self.new_lock(task, bound, name, request.id)
        reply = lock.try_acquire()
        if (
            not reply.acquired
            and not reply.other_run
            and self.limit == 1
            and free_revoked_holder(task, bound.space.named(name), reply.holder)
        ):
            reply = lock.try_acquire()  # a holder revoked while queued never lets go
        if not reply.acquired and self.conflict.wait_timeout is not None:
            reply = lock.try_acquire(self.conflict.wait_timeout)
        if reply.acquired:
            held = lock.held if isinstance(lock, Semaphore) else lock
            assert held is not None, "an acquired semaphore holds a slot"
            return self.started(at, held, limiter)
        if reply.other_run:
            log.warning(
                "not running %s[%s]: this message was delivered again while its first run is "
                "still alive (it holds %s); dropping this delivery",
                task.name,
                request.id,
                lock.key,
            )
            raise Ignore()
        return self.refused(at, self.job_of(at), lock, reply)

    def started(self, at: Attempt, held: ReentrantLock, limiter: RateLimiter | None) -> TaskRun:
        """The run took its job's lock (``held``): its ``lock_rate`` turn, then its start.
        Every way a run gets the lock comes here, so that no start goes without a turn."""
        turn = None if limiter is None else self.admit(at, held, limiter)
        run = self.entered(at, held)
        run.turn, run.start = turn, (at.bound, at.message)
        return run

    def admit(self, at: Attempt, held: ReentrantLock | None, limiter: RateLimiter) -> Turn:
        """Take the run's ``lock_rate`` turn, or give its hold up (:meth:`yield_hold`) and come
        back (``held``: ``None`` with ``lock_rate`` alone). When the limiter fails (Redis),
        what the run took is let go before the error goes on."""
        assert self.rate is not None
        let_go_done = False

        def let_go(countdown: float | None) -> None:
            nonlocal let_go_done
            let_go_done = True
            if held is not None:
                self.yield_hold(at, held, countdown)

        try:
            return self.rate.admit(at.task, at.request, limiter, self.conflict, let_go)
        except LockBackendError:
            if held is not None and not let_go_done:
                with suppress(Exception):  # resent in the background when Redis fails
                    held.release_all()
            raise

    def rate_paused(self, task: Any, request: Any, run: TaskRun, seconds: float) -> NoReturn:
        """The body of ``run`` raised a rate limit of ``seconds``: pause its limiter and come
        back after it (its hold as :meth:`yield_hold` says)."""
        assert self.rate is not None and run.turn is not None and run.start is not None
        at, held = Attempt(task, request, *run.start), run.lock

        def let_go(countdown: float | None) -> None:
            if held is not None:
                self.yield_hold(at, held, countdown, run)

        self.rate.paused(task, request, run.turn, seconds, self.conflict, let_go)

    def yield_hold(
        self, at: Attempt, held: ReentrantLock, countdown: float | None, run: TaskRun | None = None
    ) -> None:
        """What the job's hold does while a call waits for its ``lock_rate`` turn, before its
        body or (``run``) after the body paused the limiter: the call comes back in
        ``countdown`` seconds, or never (``None``). A run-time lock is let go either way, for
        the job's other calls meanwhile."""
        if run is None:
            held.release_all()
            return
        # After a park for a comeback that was not sent, the hold is taken back first; let go
        # as a run's end is (a copy that waits for the run is woken), with no cooldown.
        run.unpark()
        run.finish("a rate limit", failed=False, cooldown=False)

    def new_lock(
        self, task: Any, bound: Bound, name: str, task_id: str
    ) -> ReentrantLock | Semaphore:
        """The lock (or slots) a run of ``task`` takes: owned by the task id, with a run token
        of its own, renewed while it runs."""
        info = holder_info(task.name, task_id, self.limit)
        if self.limit > 1:
            return bound.space.semaphore(
                name,
                self.limit,
                ttl=bound.ttl,
                owner=task_id,
                info=info,
                run_token=new_run_token(),
                state=AT_RUN,
            )
        return bound.space.checked_lock(
            name, ttl=bound.ttl, owner=task_id, info=info, run_token=new_run_token(), state=AT_RUN
        )

    def publish(
        self,
        task: Any,
        send: Any,
        args: Any,
        kwargs: Any,
        task_id: str | None,
        options: dict[str, Any],
        has_callbacks: bool,
    ) -> Any:
        """``apply_async``: a run-time lock takes nothing at publish."""
        return send(task_id, options)

    def take_for_message(
        self, task: Any, task_id: str, args: Any, kwargs: Any, headers: dict[str, Any]
    ) -> None:
        """``install()``'s receiver for a message sent by name: nothing to take."""

    def entered(self, at: Attempt, lock: ReentrantLock) -> TaskRun:
        """The run holds its job's lock."""
        return TaskRun(at.task, lock)

    def refused(
        self, at: Attempt, job: NamedLock, lock: ReentrantLock | Semaphore, reply: AcquireReply
    ) -> TaskRun:
        """A run-time duplicate: ``lock_on_locked``'s choice (it raises)."""
        reason = refusal_reason(at.task, self.cooldown, job, reply.holder)
        self.conflict.refused(at.task, at.request, lock.key, reply, reason)

    def failed_before_body(
        self,
        task: Any,
        request: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        exc: BaseException,
    ) -> None:
        """A run that failed before its body (a setting Redis cannot use, Redis failing):
        nothing of it is held (its publish's hold is freed by the modes that take one)."""

    # -- the worker's main process ------------------------------------------------------------

    def release_for(
        self,
        task: Any,
        task_id: str,
        message: str,
        why: str,
        *,
        requeued: bool = False,
        ran: bool = False,
        wait: Any = None,
    ) -> None:
        """Release every hold of ``task_id`` on its job's lock after its pool process died, a
        hard time limit or a revoke. ``requeued``: the message goes back to the queue
        (``reject_on_worker_lost``): the hold is parked for its redelivery. ``ran``: the run
        had started and ended as a failure: its cooldown, if a failure starts one, parks it."""
        if not self.holds_lock:
            return  # lock_rate alone: the run held no lock
        app = task.app
        bound = task.locking.bound(app)
        name = self.run_lock(message)
        job = bound.space.named(name, self.limit)
        key = job.keys[0].lock
        info = holder_info(task.name, task_id)
        if requeued:
            lease = task.locking.queue_ttl(app)
            if job.park(task_id, lease, info=info, state=AT_REDELIVERY):
                log_release.info(
                    "kept %s of %s[%s] for its redelivery after %s", key, task.name, task_id, why
                )
            return
        self.release_queued(task, bound, message, task_id)
        seconds = None if self.cooldown is None or not ran else self.cooldown.after(True)
        if seconds is not None and job.park(task_id, seconds, info=info, state=AT_COOLDOWN):
            log_release.info("%s cools down for %.1f s after %s[%s]", key, seconds, task.name, why)
            self.released(task, job, task_id, True, wait, cooldown=seconds)
            return
        # Resent from the background when Redis fails, for as long as the run's lease could
        # keep the hold.
        reply = job.release(task_id, retry_for=bound.ttl)
        self.released(task, job, task_id, reply.freed, wait)
        if reply.freed:
            log_release.info("released %s of %s[%s] after %s", key, task.name, task_id, why)

    def replaced(self, task: Any, job: NamedLock, holder: str, by: str) -> None:
        """A debounced call ``by`` replaced the message of ``holder`` holding ``job``."""

    def release_queued(self, task: Any, bound: Bound, message: str, task_id: str) -> None:
        """The run's message lock, when it is another lock than the run's (queue mode)."""

    def released(
        self, task: Any, job: NamedLock, task_id: str, freed: bool, wait: Any, cooldown: float = 0.0
    ) -> None:
        """The main process let the run's hold on ``job`` go, or parked it for a ``cooldown``
        of that many seconds (queue mode wakes the copy waiting, to come back when the job is
        free)."""


#: every mode is a :class:`RunMode`
Mode = RunMode


def free_revoked_holder(task: Any, job: NamedLock, holder: str) -> bool:
    """Free the hold of ``holder`` on ``job`` if that task was revoked while its message
    waited (queued, or requeued for a retry): no worker may reach its message for a long time,
    or ever. Only when its state is REVOKED, and atomically (Redis checks the holder and its
    state again as it releases); on any error the holder is taken to be alive."""
    try:
        freed = release_if_in(
            job,
            holder,
            REVOCABLE,
            lambda: task.backend.get_state(holder) == states.REVOKED,
        )
    except Exception as exc:
        log_release.debug("not freeing %s of revoked task %s: %r", job.name, holder, exc)
        return False
    if freed:
        log_release.info(
            "released %s: its holder, task %s, was revoked while queued", job.keys[0].lock, holder
        )
    return freed
