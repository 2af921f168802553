"""Lock names of Celery task calls: the task name plus the arguments bound to its signature
(``f(1)``, ``f(x=1)`` and ``f(1, y=<default>)`` are one), in a canonical form that survives
the serializer's round trip (json makes tuples lists, int dict keys strings; pickle does not),
so the publisher and the worker compute the same name.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import inspect
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

#: the longest argument part (or task name) kept as written; longer ones are hashed
MAX_PART = 128


#: json.dumps(value, sort_keys=True, separators=(",", ":")) with the encoder made once
_KEY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


#: the JSON of the values :func:`_plain_json` writes itself, by exact type
_PLAIN: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
}


def _plain_json(arguments: Mapping[str, Any]) -> str | None:
    """``_KEY_JSON(sorted(canonical items))`` without the encoder, at a fraction of its cost
    (a name is made at every publish and run), for arguments that are all str, int, bool or
    ``None``; else ``None``."""
    parts = []
    for name in sorted(arguments):
        write = _PLAIN.get(type(arguments[name]))
        if write is None:
            return None
        parts.append(f"[{encode_basestring_ascii(name)},{write(arguments[name])}]")
    return f"[{','.join(parts)}]"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _bounded(text: str) -> str:
    if len(text) <= MAX_PART:
        return text
    return f"{text[: MAX_PART - 34]}~{_digest(text)}"


def _dict_key(key: object, where: str) -> str:
    # json writes every key as a string: do the same so that both sides agree
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, float)):
        return json.dumps(key)  # null, true, false; NaN, Infinity (repr says nan, inf)
    if isinstance(key, int):
        return str(key)
    raise TypeError(
        f"cannot build a lock key: argument {where!r} has a dict key of type "
        f"{type(key).__name__}; pass lock_key=callable or lock_unique_on=[...] to choose the "
        "key's arguments"
    )


def canonical(value: Any, where: str) -> Any:
    """A JSON-able canonical form of ``value``; ``where`` names the argument for errors."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ["$float", repr(value)]
    if isinstance(value, (list, tuple)):
        return [canonical(v, where) for v in value]
    if isinstance(value, Mapping):
        items = {_dict_key(k, where): canonical(v, where) for k, v in value.items()}
        return {"$dict": sorted(items.items())}
    if isinstance(value, datetime.datetime):
        return ["$datetime", value.isoformat()]
    if isinstance(value, datetime.date):
        return ["$date", value.isoformat()]
    if isinstance(value, datetime.time):
        return ["$time", value.isoformat()]
    if isinstance(value, datetime.timedelta):
        return ["$timedelta", value.total_seconds()]
    if isinstance(value, uuid.UUID):
        return ["$uuid", value.hex]
    if isinstance(value, decimal.Decimal):
        return ["$decimal", str(value)]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ["$bytes", bytes(value).hex()]
    if isinstance(value, (set, frozenset)):
        return ["$set", sorted(json.dumps(canonical(v, where), sort_keys=True) for v in value)]
    raise TypeError(
        f"cannot build a lock key: argument {where!r} is a {type(value).__module__}."
        f"{type(value).__qualname__}, which has no stable encoding; pass lock_key=callable "
        "(returning a str from the arguments) or lock_unique_on=[...] (naming the arguments "
        "that identify the job)"
    )


def bind_arguments(
    signature: inspect.Signature | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    strict_for: str | None = None,
    positional: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The arguments by parameter name, defaults applied. When they do not fit the signature:
    with ``strict_for`` (a task's name), a ``TypeError`` naming it and what does not fit;
    without it, positional ones by index (the name stays stable, the run fails on its own)."""
    if signature is not None:
        if not kwargs and positional is not None and len(positional) == len(args):
            # Every parameter given by position (the usual message): what bind() returns,
            # without its general machinery (a name is made at every publish and run).
            return dict(zip(positional, args, strict=True))
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            if strict_for is not None:
                # the parameters as the task's def lists them, without annotations (x, y=2)
                bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
                listed = signature.replace(parameters=bare, return_annotation=signature.empty)
                raise TypeError(
                    f"task {strict_for!r} takes {listed}: {exc}; its lock "
                    "key is made of the arguments bound to those parameters, so they must fit"
                ) from None
        else:
            bound.apply_defaults()
            return dict(bound.arguments)
    merged: dict[str, Any] = {f"${i}": v for i, v in enumerate(args)}
    merged.update(kwargs)
    return merged


def task_lock_name(
    task_name: str,
    signature: inspect.Signature | None,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    unique_on: Sequence[str] | None = None,
    key_func: Callable[..., Any] | None = None,
    *,
    strict: bool = False,
    encoder: type[json.JSONEncoder] | None = None,
    positional: tuple[str, ...] | None = None,
) -> str:
    """The lock name of one job: ``task name:argument part``, bounded in length. ``strict``:
    arguments that do not fit the signature raise ``TypeError`` (see :func:`bind_arguments`).
    ``encoder`` writes the arguments instead of :func:`canonical`, which writes what it
    refuses: strings, numbers, booleans, ``None`` and lists of them hash as without it."""
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    if key_func is not None:
        if strict and signature is not None:
            # The call must fit the task as it must without lock_key: a key function that
            # takes what it does not use (*args) would make a key of a call no run can take.
            bind_arguments(signature, args, kwargs, strict_for=task_name)
        part = key_func(*args, **kwargs)
        if not isinstance(part, str):
            raise TypeError(
                f"lock_key of task {task_name!r} must return a str, got {type(part).__name__}"
            )
        return f"{_bounded(task_name)}:{_bounded(part)}"
    arguments = bind_arguments(
        signature, args, kwargs, strict_for=task_name if strict else None, positional=positional
    )
    if unique_on is not None:
        extra: Any = {}
        if signature is not None and not all(name in arguments for name in unique_on):
            # a name that is not a parameter of its own is looked up in the task's **kwargs
            # (the class check admits it there): f(user_id=7) and f(user_id=8) of
            # def f(**options) are two jobs
            var_kw = [p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
            extra = arguments.get(var_kw[0]) if var_kw else {}
            extra = extra if isinstance(extra, Mapping) else {}
        arguments = {n: arguments[n] if n in arguments else extra.get(n) for n in unique_on}
    if encoder is None:
        text = _plain_json(arguments)
        if text is None:
            encoded = {name: canonical(value, name) for name, value in arguments.items()}
            text = _KEY_JSON(sorted(encoded.items()))
    else:
        text = _encoded(encoder, arguments)
    return f"{_bounded(task_name)}:{_digest(text)}"


def _encoded(encoder: type[json.JSONEncoder], arguments: dict[str, Any]) -> str:
    """The arguments as ``encoder`` writes them (what it refuses as :func:`canonical` does)."""
    instance: json.JSONEncoder
    where = ""

    def fallback(value: Any) -> Any:
        try:
            return type(instance).default(instance, value)
        except TypeError:
            return canonical(value, where)

    # json.dumps passes default= to every encoder class; it replaces the class's default() on
    # this instance only, which fallback() still calls first.
    instance = encoder(sort_keys=True, separators=(",", ":"), default=fallback)
    parts = []
    for where, value in sorted(arguments.items()):  # a loop: fallback() reads `where`
        parts.append(f"[{_KEY_JSON(where)},{instance.encode(value)}]")
    return f"[{','.join(parts)}]"
