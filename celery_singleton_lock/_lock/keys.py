"""Redis key names of a lock and of a rate limiter, each in one ``{...}`` hash tag."""

from __future__ import annotations

import re
from dataclasses import dataclass


def check_prefix(prefix: object, parameter: str = "prefix") -> str:
    if not isinstance(prefix, str) or not prefix:
        raise TypeError(f"{parameter} must be a non-empty str, got {prefix!r}")
    if "{" in prefix or "}" in prefix:
        raise ValueError(
            f"{parameter} {prefix!r} must not contain '{{' or '}}': the lock name is the Redis "
            "Cluster hash tag of every key of a lock, and braces in the prefix would move it"
        )
    return prefix


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    return name


def escape_name(name: str) -> str:
    """``name`` inside the braces of its keys: ``%`` and ``}`` percent-escaped."""
    return name.replace("%", "%25").replace("}", "%7D")


def unescape_name(escaped: str) -> str:
    return escaped.replace("%7D", "}").replace("%25", "%")


def glob_escape(text: str) -> str:
    """``text`` matched literally in a SCAN pattern: ``jobs[1]`` or ``a*`` must match only
    itself."""
    return _GLOB.sub(r"\\\g<0>", text)


_GLOB = re.compile(r"[\\*?\[\]]")
#: a lock key as for_name writes it (not ":s01", ":s1"): ":meta" and others are no lock
_LOCK_KEY = re.compile(r"((?:(?!:\{).)*):\{([^}]*)\}(?::s([2-9]|[1-9][0-9]+))?", re.DOTALL)


@dataclass(frozen=True)
class LockKeys:
    """The keys of one lock: ``lock`` (field = owner, value = hold count), ``meta`` (what
    outlives a hold, see lua/acquire.lua) and ``channel`` (the wake-up channel, passed to the
    scripts as an argument: a Cluster script with a missing key in a migrating slot is refused).
    ``slot`` is the permit: 1 is ``prefix:{name}``, k >= 2 ``prefix:{name}:s<k>``, all with
    permit 1's channel and one hash tag."""

    prefix: str
    name: str
    lock: str
    meta: str
    channel: str
    slot: int = 1

    @classmethod
    def for_name(cls, prefix: str, name: str, slot: int = 1) -> LockKeys:
        # The whole name is the hash tag; a '}' in it is escaped (Redis ends a tag at the first).
        base = f"{prefix}:{{{escape_name(name)}}}"
        if type(slot) is not int or slot < 1:
            raise ValueError(f"slot must be an int >= 1, got {slot!r}")
        lock = base if slot == 1 else f"{base}:s{slot}"
        # As cls(...) makes it, at a third of the cost (every job makes its keys).
        keys = object.__new__(cls)
        fields = vars(keys)
        fields.update(prefix=prefix, name=name, lock=lock, meta=lock + ":meta", slot=slot)
        fields["channel"] = base + ":wake"
        return keys

    @classmethod
    def from_lock_key(cls, lock_key: str) -> LockKeys:
        """The keys of a lock found by SCAN: ``prefix:{name}`` or ``prefix:{name}:s<k>``."""
        match = _LOCK_KEY.fullmatch(lock_key)
        if match is None:
            raise ValueError(
                f"{lock_key!r} is not a lock key of the form 'prefix:{{name}}' or "
                "'prefix:{name}:s<k>'"
            )
        prefix, tag, slot = match.groups()
        return cls.for_name(prefix, unescape_name(tag), int(slot or 1))

    def records(self, kind: str) -> str:
        """A hash of records kept beside the lock, in its hash tag."""
        return f"{self.lock}:{kind}"

    def note(self, kind: str, owner: str) -> str:
        """A note about one owner's hold, kept after it (see lua/force_release.lua)."""
        return f"{self.lock}:{kind}:{owner}"

    @property
    def pair(self) -> tuple[str, str]:
        return (self.lock, self.meta)


@dataclass(frozen=True)
class RateKeys:
    """The keys of one rate limiter: ``log`` (``prefix:rate:{name}``, a sorted set of starts and
    turns) and ``state`` (``<log>:state``: the rule last used and a pause); ``rate:`` keeps them
    out of a lock SCAN."""

    prefix: str
    name: str
    log: str
    state: str

    @classmethod
    def for_name(cls, prefix: str, name: str) -> RateKeys:
        log = f"{prefix}:rate:{{{escape_name(name)}}}"
        return cls(prefix, name, log, log + ":state")

    @classmethod
    def from_key(cls, prefix: str, key: str) -> RateKeys | None:
        """The keys of the limiter whose log or state ``key`` is, else ``None``."""
        head = f"{prefix}:rate:{{"
        tag, brace, suffix = key[len(head) :].partition("}")
        if not key.startswith(head) or not brace or suffix not in ("", ":state"):
            return None
        return cls.for_name(prefix, unescape_name(tag))

    @property
    def pair(self) -> tuple[str, str]:
        return (self.log, self.state)
