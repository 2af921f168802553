"""How one task class locks: its options (validated when the class is made), its mode, how a
call's lock name is made, and what it resolves once per app (:class:`Bound`).
``LockedTask.locking`` is one of these, made with the class."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from .._lock import LockSpace, LockState
from .config import Bound, LockConfig
from .modes import RunMode, mode_for
from .options import OPTION_NAMES, LockOptions, check_option_names, validate_options
from .taskkey import task_lock_name


def run_signature(cls: type) -> inspect.Signature | None:
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
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return sig


class TaskLocking:
    """A task class's locking."""

    __slots__ = ("_bound", "mode", "options", "positional", "signature", "strict", "task_class")

    def __init__(
        self,
        options: LockOptions,
        signature: inspect.Signature | None,
        strict: bool = True,
        *,
        task_class: Any,
    ) -> None:
        self.options = options
        #: the class whose extension points (``key_prefix``, ``queue_lease``, ``key_encoder``)
        self.task_class = task_class
        self.signature = signature
        #: the parameter names when every one may be given by position (``bind_arguments``'s
        #: short way), else ``None``
        self.positional: tuple[str, ...] | None = None
        params = () if signature is None else signature.parameters.values()
        if signature is not None and all(p.kind <= p.POSITIONAL_OR_KEYWORD for p in params):
            self.positional = tuple(signature.parameters)
        #: arguments that do not fit the signature raise ``TypeError`` (as ``Task.typing``)
        self.strict = strict
        self.mode: RunMode = mode_for(options)
        self._bound: Bound | None = None

    @classmethod
    def of_class(cls, task_class: type, base: type) -> TaskLocking:
        """Read and check the options of ``task_class`` (a subclass of ``base``, whose
        attributes are the defaults): an error names the task and the option."""
        defaults = LockOptions()
        # Set when a class below ``base`` defines it, even to its default (lock_limit=1 beside
        # lock_rate means one at a time, not lock_rate alone).
        below = task_class.__mro__[: task_class.__mro__.index(base)]
        raw = {}
        for name in OPTION_NAMES:
            value = inspect.getattr_static(task_class, name)
            if isinstance(value, staticmethod):
                value = value.__func__
            if value is not getattr(defaults, name) or any(name in vars(k) for k in below):
                raw[name] = value
        task = str(task_class.__dict__.get("name") or task_class.__qualname__)
        # Celery turns every decorator keyword into a class attribute: a misspelt option would
        # be ignored in silence (own_lock_attributes: a subclass's own, a drop-in's lock_expiry).
        own: set[str] = set()
        for klass in task_class.__mro__:
            own.update(vars(klass).get("own_lock_attributes", ()))
        check_option_names(
            task,
            (
                a
                for a in task_class.__dict__
                if a.startswith("lock_") and not hasattr(base, a) and a not in own
            ),
        )
        signature = run_signature(task_class)
        strict = getattr(task_class, "typing", True) is not False
        options = validate_options(task, raw, signature)
        return cls(options, signature, strict, task_class=task_class)

    def lock_name(
        self, task_name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
    ) -> str:
        """The lock name of one call (``task name:argument part``)."""
        key_func = self.options.lock_key
        return task_lock_name(
            task_name,
            self.signature,
            args,
            kwargs,
            unique_on=self.options.lock_unique_on,
            key_func=key_func,
            strict=self.strict,
            encoder=None if key_func is not None else self.task_class.key_encoder(),
            positional=self.positional,
        )

    def bound(self, app: Any) -> Bound:
        """The class's lock space and lease under ``app``'s config, resolved once per config."""
        config = LockConfig.of(app)
        bound = self._bound
        if bound is None or bound.config is not config:
            ttl = config.ttl if self.options.lock_ttl is None else self.options.lock_ttl
            space = config.space(self.task_class.key_prefix(app))
            bound = self._bound = Bound(config, space, ttl)
        return bound

    def space(self, app: Any) -> LockSpace:
        return self.bound(app).space

    def queue_ttl(self, app: Any) -> float:
        """The lease of a hold while its message waits (``LockedTask.queue_lease``)."""
        lease: float = self.task_class.queue_lease(app)
        return lease

    def states(self, app: Any, name: str) -> list[LockState]:
        """Every lock of the job ``name`` as Redis has it now: its slots, then its queued lock
        (``lock_at="queue"``)."""
        limit = self.options.lock_limit
        if limit is None:
            return []  # lock_rate alone: the job holds no lock
        space = self.space(app)
        states: list[LockState] = space.named(name, limit).inspect()
        message = self.mode.message_lock(name)
        if message != name:
            states += space.named(message).inspect()
        return states
