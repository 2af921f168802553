"""Lock keys for Celery tasks: the task name plus the arguments bound to its signature.

``f(1)``, ``f(x=1)`` and ``f(1, y=<default>)`` are one key. Values are put in a canonical form
that survives the message serializer's round trip (json turns tuples into lists and int dict
keys into strings; pickle keeps both), so the publisher and the worker compute the same key.
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

__all__ = ["MAX_PART", "bind_arguments", "canonical", "task_lock_name"]

#: the longest argument part (or task name) kept as written; longer ones are hashed
MAX_PART = 128


#: json.dumps(value, sort_keys=True, separators=(",", ":")), with the encoder made once (json.dumps
#: builds a new one per call whenever an option is given)
_KEY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


#: the JSON of the values :func:`_plain_json` writes itself, by type (exact types: a subclass of
#: ``int`` or ``str`` goes the general way)
_PLAIN: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
}


def _plain_json(arguments: Mapping[str, Any]) -> str | None:
    """``_KEY_JSON(sorted(canonical items))`` for arguments that are all strings, ints,
    booleans or ``None`` (most calls), written without the JSON encoder: the same text, at a
    fraction of its cost (a key is made at every publish and run); ``None`` for any other
    value."""
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
    # json writes every key as a string; do the same here so both sides agree.
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        # json's spelling: NaN / Infinity / -Infinity for non-finite keys (repr says nan, inf)
        return json.dumps(key)
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
        items = {}
        for k, v in value.items():
            items[_dict_key(k, where)] = canonical(v, where)
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


#: id(signature) -> (signature, its parameter names when all are plain positional-or-keyword ones
#: without a default, else None); the signature is kept so that its id stays its own
_positional: dict[int, tuple[inspect.Signature, tuple[str, ...] | None]] = {}


def _positional_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    entry = _positional.get(id(signature))
    if entry is None or entry[0] is not signature:
        params = signature.parameters.values()
        plain = all(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
            for p in params
        )
        if len(_positional) >= 1024:  # one per task class in practice; never unbounded
            _positional.clear()
        entry = _positional[id(signature)] = (
            signature,
            tuple(p.name for p in params) if plain else None,
        )
    return entry[1]


def bind_arguments(
    signature: inspect.Signature | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    strict_for: str | None = None,
) -> dict[str, Any]:
    """The arguments by parameter name, defaults applied.

    When they do not fit the signature: with ``strict_for`` (a task's name), a ``TypeError``
    naming that task and what does not fit (a missing or unexpected argument); without it,
    positional ones by index (the key stays stable, and the run fails on its own)."""
    if signature is not None:
        if not kwargs:
            # Every parameter given by position (the usual message): what bind() returns,
            # without its general machinery (the key is computed on every publish and run).
            names = _positional_names(signature)
            if names is not None and len(names) == len(args):
                return dict(zip(names, args, strict=True))
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            if strict_for is not None:
                raise TypeError(
                    f"task {strict_for!r} takes ({_parameters(signature)}): {exc}; its lock "
                    "key is made of the arguments bound to those parameters, so they must fit"
                ) from None
        else:
            bound.apply_defaults()
            return dict(bound.arguments)
    merged: dict[str, Any] = {f"${i}": v for i, v in enumerate(args)}
    merged.update(kwargs)
    return merged


def _parameters(signature: inspect.Signature) -> str:
    """The parameters as the task's ``def`` lists them, without annotations (``x, y=2``)."""
    bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=signature.empty))[1:-1]


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
    arguments = bind_arguments(signature, args, kwargs, strict_for=task_name if strict else None)
    if unique_on is not None:
        arguments = _unique(signature, arguments, unique_on)
    if encoder is None:
        text = _plain_json(arguments)
        if text is None:
            encoded = {name: canonical(value, name) for name, value in arguments.items()}
            text = _KEY_JSON(sorted(encoded.items()))
    else:
        text = _encoded(encoder, arguments)
    return f"{_bounded(task_name)}:{_digest(text)}"


def _unique(
    signature: inspect.Signature | None, arguments: dict[str, Any], unique_on: Sequence[str]
) -> dict[str, Any]:
    """``unique_on``'s arguments: a name that is not a parameter of its own is looked up in the
    task's ``**kwargs`` (the class check admits it there), so ``f(user_id=7)`` and
    ``f(user_id=8)`` of ``def f(**options)`` are two jobs."""
    if all(name in arguments for name in unique_on):
        return {name: arguments[name] for name in unique_on}
    extra: Mapping[str, Any] = {}
    if signature is not None:
        var_kw = next(
            (p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None
        )
        if var_kw is not None and isinstance(arguments.get(var_kw), Mapping):
            extra = arguments[var_kw]
    return {name: arguments[name] if name in arguments else extra.get(name) for name in unique_on}


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
