"""All the settings of an app checked at once, for the places a mistake is cheap to fix: a
worker's and beat's start (:mod:`.startup`), a process's first lock client (:mod:`.client`) and
Django's system checks, each on the settings as :mod:`.settings` read them. A wrong value is
named as the user wrote it; a name under this package's prefix that is no setting (a
misspelling) is reported with the closest setting, as a misspelt task option is.
"""

from __future__ import annotations

import difflib
from typing import Any

from .settings import SETTINGS, settings_of

__all__ = ["check_settings", "settings_problems"]

#: names under this package's prefix that belong to another package, never a misspelling of
#: ours: celery-singleton's lease setting, which its drop-in (compat.singleton) reads
_OTHER_PACKAGES_NAMES = frozenset({"singleton_lock_expiry"})


def settings_problems(app: Any) -> list[str]:
    """Every problem of the app's settings, one message each: a value its setting cannot take
    (named as the user wrote it), and a name under this package's prefix that is no setting
    (with the closest setting as a suggestion). Empty when all is well."""
    return [str(problem) for problem in _problems(app)]


def _problems(app: Any) -> list[TypeError | ValueError]:
    settings = settings_of(app)
    problems = settings.problems()
    written_names = settings.written
    for name in sorted(set(written_names) - set(SETTINGS) - _OTHER_PACKAGES_NAMES):
        written = written_names[name]
        # suggest in the user's own spelling (CELERY_SINGLETON_LOCK_TTL, not singleton_lock_ttl)
        close = difflib.get_close_matches(name, list(SETTINGS), 1)
        hint = f" (did you mean {_respelled(written, close[0])}?)" if close else ""
        problems.append(
            ValueError(
                f"{written} is not a celery-singleton-lock setting{hint}; the settings are "
                f"{', '.join(_respelled(written, s) for s in SETTINGS)}"
            )
        )
    return problems


def _respelled(written: str, name: str) -> str:
    """The setting ``name`` spelt as ``written`` is (upper case, Django's ``CELERY_``)."""
    lowered = written.lower()
    spelt = "celery_" + name if lowered.startswith("celery_singleton_lock_") else name
    return spelt.upper() if written.isupper() else spelt


def check_settings(app: Any) -> None:
    """Raise what :func:`settings_problems` finds: the one problem as it is (``TypeError`` or
    ``ValueError``), several as one ``ValueError`` listing them all."""
    problems = _problems(app)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ValueError("celery-singleton-lock settings: " + "; ".join(map(str, problems)))
