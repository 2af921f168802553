"""``lock_at="run"``, and what every mode shares: the run takes its job's lock (or one of its
``lock_limit`` slots) before the body and lets it go as the body returns; a duplicate meanwhile
is handled as ``lock_on_locked`` says. :mod:`.publish` and :mod:`.queue` extend it."""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any, ClassVar, NamedTuple, NoReturn

from celery import states
from celery.exceptions import Ignore

from ..._errors import LockBackendError
from ..._lock import AcquireReply, NamedLock, RateLimiter, ReentrantLock, Semaphore, new_run_token
from ..config import Bound
from ..conflict import Conflict, conflict_for
from ..hold import MessageLock, holder_info, release_if_in
from ..lifecycle import AT_COMEBACK, AT_COOLDOWN, AT_REDELIVERY, AT_RUN, REVOCABLE
from ..options import LockOptions
from ..parts import REPLACED, Cooldown, Debounce, refusal_reason, skip_replaced
from ..rate import TaskRate, Turn
from ..run import TaskRun

log = logging.getLogger("celery_singleton_lock.run")
log_release = logging.getLogger("celery_singleton_lock.release")


class Attempt(NamedTuple):
    """A run taking its job's lock."""

    task: Any
    request: Any
    bound: Bound
    #: the lock its message holds, or would hold
    message: str


class RunMode:
    """``lock_at="run"``: held while the task runs."""

    at_publish: ClassVar[bool] = False
    #: a job's message lock is its name with this after it (queue mode: the queued lock)
    suffix: ClassVar[str] = ""

    def __init__(self, options: LockOptions) -> None:
        self.options = options
        #: ``False`` with ``lock_rate`` alone (``lock_limit=None``): a run takes no lock
        self.holds_lock = options.lock_limit is not None
        self.limit = options.lock_limit or 1
        #: how many messages of one job may hold its message lock at once: a publish's hold is
        #: its run's; queue mode's is the one copy that waits
        self.message_permits = 1 if self.suffix else self.limit
        self.conflict: Conflict = conflict_for(options)
        self.cooldown: Cooldown | None = None
        if options.lock_cooldown is not None:
            self.cooldown = Cooldown(options.lock_cooldown, options.lock_cooldown_on_failure)
        self.rate = None if options.lock_rate is None else TaskRate(options)
        self.debounce = None if options.lock_debounce is None else Debounce(options.lock_debounce)

    def message_lock(self, name: str) -> str:
        """The lock a queued message of the job ``name`` holds."""
        return name + self.suffix

    def run_lock(self, message_lock: str) -> str:
        """The lock a run takes, from the lock its message holds."""
        return message_lock.removesuffix(self.suffix)

    def job_of(self, at: Attempt) -> NamedLock:
        return at.bound.space.named(self.run_lock(at.message), self.limit)

    def message_lock_of(self, task: Any, request: Any, args: Any, kwargs: Any) -> str:
        """The lock a message holds or would hold: the one its headers (or request) name, else
        the one its arguments make."""
        lock = MessageLock.of(request)
        if lock is not None:
            return lock.name
        return self.message_lock(task.locking.lock_name(task.name, args, kwargs))

    def enter(self, task: Any, request: Any, args: Any, kwargs: Any) -> TaskRun:
        """Take the job's lock for this run, or handle the run as a duplicate (raises)."""
        message = self.message_lock_of(task, request, args, kwargs)
        bound = task.locking.bound(task.app)
        try:
            return self.take(Attempt(task, request, bound, message))
        except LockBackendError as exc:
            proceed_without_lock(log, task, "going on", exc)
            return TaskRun(task, None)

    def check_rate(self, task: Any, name: str, args: Any, kwargs: Any) -> None:
        """A ``lock_rate`` or ``lock_rate_key`` callable's bad answer fails the call here,
        before its lock is taken."""
        if self.rate is not None and self.rate.asks:
            self.rate.answer(task, name, args, kwargs)

    def limiter_of(self, at: Attempt) -> RateLimiter | None:
        """The call's ``lock_rate`` limiter (a callable that fails does so before any write)."""
        if self.rate is None:
            return None
        name = self.run_lock(at.message)
        return self.rate.limiter(at.task, at.bound, name, at.request.args, at.request.kwargs)

    def take(self, at: Attempt) -> TaskRun:
        task, request, bound, message = at
        name = self.run_lock(message)
        limiter = self.limiter_of(at)
        if not self.holds_lock:  # lock_rate alone: no lock, the limiter only
            assert limiter is not None, "lock_limit=None is refused without lock_rate"
            return TaskRun(task, None, turn=self.admit(at, None, limiter))
        # owned by the task id, with a run token of its own
        info = holder_info(task.name, request.id, self.limit)
        ttl, owner, token = bound.ttl, request.id, new_run_token()
        lock: ReentrantLock | Semaphore
        if self.limit > 1:
            lock = bound.space.semaphore(
                name, self.limit, ttl=ttl, owner=owner, info=info, run_token=token, state=AT_RUN
            )
        else:  # (keywords, not a dict of them: a run's start is on every job's path)
            lock = bound.space.checked_lock(
                name, ttl=ttl, owner=owner, info=info, run_token=token, state=AT_RUN
            )
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
            return self.started(at, lock, limiter)
        if reply.other_run:
            log.warning(
                "not running %s[%s]: this message was delivered again while its first run is "
                "still alive (it holds %s); dropping this delivery",
                task.name,
                request.id,
                lock.key,
            )
            raise Ignore()
        return self.refused(at, lock, reply)

    def started(
        self, at: Attempt, lock: ReentrantLock | Semaphore, limiter: RateLimiter | None
    ) -> TaskRun:
        """The run took its job's ``lock``: its ``lock_rate`` turn, then its start (every way a
        run gets the lock comes here, so that no start goes without a turn)."""
        held = lock.held if isinstance(lock, Semaphore) else lock
        assert held is not None, "an acquired semaphore holds a slot"
        turn = None if limiter is None else self.admit(at, held, limiter)
        return TaskRun(at.task, held, turn=turn)

    def admit(self, at: Attempt, held: ReentrantLock | None, limiter: RateLimiter) -> Turn:
        """Take the call's ``lock_rate`` turn, or (it raises) come back for it: meanwhile a
        run-time lock is let go; publish and queue modes keep the job's place for the comeback,
        as for a retry. When the limiter fails (Redis), what the run took is let go first."""
        assert self.rate is not None
        gave_up = False

        def let_go(countdown: float | None) -> None:
            nonlocal gave_up
            gave_up = True
            if held is None:
                return
            if countdown is not None and self.at_publish:
                self.park_place(at, held, countdown + at.task.locking.queue_ttl(at.task.app))
            else:
                held.release_all()
                self.release_queued(at.task, at.bound, at.message, at.request.id)

        try:
            return self.rate.admit(at.task, at.request, limiter, self.conflict, let_go)
        except LockBackendError:
            if held is not None and not gave_up:
                with suppress(Exception):  # resent in the background when Redis fails
                    held.release_all()
            raise

    def rate_paused(self, task: Any, request: Any, run: TaskRun, seconds: float) -> NoReturn:
        """The body of ``run`` raised a rate limit of ``seconds``: come back after it, the hold
        parked as for a retry (publish and queue modes) or let go."""
        assert run.turn is not None and self.rate is not None

        def let_go(countdown: float | None) -> None:
            if countdown is not None and self.at_publish:
                run.park(countdown)
            else:
                # After a park for a comeback that was not sent, the hold is taken back first;
                # let go as a run's end is (a copy that waits for the run is woken), no cooldown.
                run.unpark()
                run.finish("a rate limit", failed=False, cooldown=False)

        self.rate.paused(task, request, run.turn, seconds, self.conflict, let_go)

    def park_place(self, at: Attempt, held: ReentrantLock, lease: float) -> None:
        """Keep the job's hold for the call that comes back for its turn."""
        held.park(lease, holder_info(at.task.name, at.request.id), AT_COMEBACK)

    def refused(self, at: Attempt, lock: ReentrantLock | Semaphore, reply: AcquireReply) -> TaskRun:
        """A run-time duplicate: ``lock_on_locked``'s choice (it raises)."""
        # a later call may have taken its publish hold over since the run looked
        self.skip_if_replaced(at)
        reason = refusal_reason(at.task, self.cooldown, self.job_of(at), reply.holder)
        self.conflict.refused(at.task, at.request, lock.key, reply, reason)

    def skip_if_replaced(self, at: Attempt) -> None:
        """With ``lock_debounce``: end the run (SKIPPED) if a later call replaced its message."""
        if self.debounce is not None:
            job = at.bound.space.named(at.message)
            by = job.note(REPLACED, at.request.id)
            if by is not None:
                skip_replaced(at.task, at.request, job.keys[0].lock, by)

    def failed_before_body(
        self, task: Any, request: Any, args: Any, kwargs: Any, exc: BaseException
    ) -> None:
        """A run that failed before its body (a setting Redis cannot use, Redis failing) ends
        its job: free the hold its publish took (a mode that takes one), or a new publish of
        the job would get this failed one back for the rest of the queue lease."""
        if not self.at_publish or request.is_eager:
            return
        try:
            name = self.message_lock_of(task, request, args, kwargs)
            job = task.locking.bound(task.app).space.named(name, self.message_permits)
            # Redis may be what failed: keep trying for as long as the hold could live.
            job.release(request.id, retry_for=task.locking.queue_ttl(task.app))
        except Exception as release_exc:
            log_release.error(
                "%s[%s] failed before its body (%s: %s) and its publish lock could not be freed "
                "(%s); a new publish of this job returns this task until the lock's lease ends",
                task.name,
                request.id,
                type(exc).__name__,
                exc,
                release_exc,
            )

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
        hard time limit or a revoke (the worker's main process). ``requeued``: the message goes
        back to the queue: the hold is parked for its redelivery. ``ran``: the run started and
        failed: its cooldown, if a failure starts one, parks it."""
        if not self.holds_lock:
            return  # lock_rate alone: the run held no lock
        bound = task.locking.bound(task.app)
        job = bound.space.named(self.run_lock(message), self.limit)
        key, info = job.keys[0].lock, holder_info(task.name, task_id)
        if requeued:
            if job.park(task_id, task.locking.queue_ttl(task.app), info=info, state=AT_REDELIVERY):
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
        # resent in the background when Redis fails, for as long as the run's lease could last
        reply = job.release(task_id, retry_for=bound.ttl)
        self.released(task, job, task_id, reply.freed, wait)
        if reply.freed:
            log_release.info("released %s of %s[%s] after %s", key, task.name, task_id, why)

    def replaced(self, task: Any, job: NamedLock, holder: str, by: str) -> None:
        """A debounced call ``by`` replaced the message of ``holder`` holding ``job``."""

    def release_queued(self, task: Any, bound: Bound, message: str, task_id: str) -> None:
        """Free the run's message lock, when it is another lock than the run's (queue mode):
        resent in the background for as long as the queued hold may live."""
        if self.suffix:
            bound.space.named(message).release(task_id, retry_for=task.locking.queue_ttl(task.app))

    def released(
        self, task: Any, job: NamedLock, task_id: str, freed: bool, wait: Any, cooldown: float = 0.0
    ) -> None:
        """The main process let the run's hold on ``job`` go, or parked it for a ``cooldown``
        (queue mode wakes the copy that waits)."""


def free_revoked_holder(task: Any, job: NamedLock, holder: str) -> bool:
    """Free the hold of ``holder`` on ``job`` if that task was revoked while its message waited
    (no worker may reach its message for a long time, or ever); checked again in Redis as it
    releases. On any error the holder is taken to be alive."""
    try:
        freed = release_if_in(
            job, holder, REVOCABLE, lambda: task.backend.get_state(holder) == states.REVOKED
        )
    except Exception as exc:
        log_release.debug("not freeing %s of revoked task %s: %r", job.name, holder, exc)
        return False
    if freed:
        log_release.info(
            "released %s: its holder, task %s, was revoked while queued", job.keys[0].lock, holder
        )
    return freed


def proceed_without_lock(logger: logging.Logger, task: Any, doing: str, exc: Exception) -> None:
    """Redis failed for the lock of ``task``: raise, or (``singleton_lock_on_backend_error=
    'proceed'``) log that the call is ``doing`` without it."""
    if not task.locking.bound(task.app).config.proceed_on_backend_error:
        raise exc
    logger.error(
        "Redis failed for the lock of task %s; %s WITHOUT the lock "
        "(singleton_lock_on_backend_error='proceed'): %s",
        task.name,
        doing,
        exc,
    )
