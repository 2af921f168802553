"""The Celery layer's settings and lock names against their own definitions: every spelling of
a setting Celery's ``conf.get`` reads (and the names an app does not read), even where the
first lock would refuse the app; a call's plain arguments text is the encoder's of their
canonical form, so a publisher and a worker of either way make the same key."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

from celery_singleton_lock._celery.config import LockConfig
from celery_singleton_lock._celery.taskkey import _KEY_JSON, _plain_json, canonical

#: LockConfig's attributes with nothing configured
DEFAULT_VALUES = {"prefix": "lock", "ttl": 30.0, "queue_ttl": 3600.0, "backend_timeout": 5.0}


class _ConfigObject:
    singleton_lock_prefix = "from-object"
    CELERY_SINGLETON_LOCK_TTL = 9  # not read: this app has no CELERY namespace


class _DjangoLike:
    SINGLETON_LOCK_PREFIX = "upper"  # not read: upper case without the namespace's CELERY_
    singleton_lock_ttl = None
    CELERY_SINGLETON_LOCK_TTL = 4


def _apps() -> list[tuple[Celery, dict[str, Any], list[str]]]:
    """Apps configured every way users do, with the settings each must read and the names it
    must report as not read."""
    direct = Celery("direct", broker="redis://127.0.0.1:1/0")
    direct.conf.singleton_lock_ttl = 5
    namespaced = Celery("namespaced")
    namespaced.config_from_object(
        {"CELERY_SINGLETON_LOCK_PREFIX": "zz", "singleton_lock_ttl": None}, namespace="CELERY"
    )
    upper = Celery("upper")
    upper.config_from_object({"SINGLETON_LOCK_QUEUE_TTL": 7})
    from_object = Celery("from_object")
    from_object.config_from_object(_ConfigObject)
    django_like = Celery("django_like")
    django_like.config_from_object(_DjangoLike, namespace="CELERY")
    return [
        (direct, {"ttl": 5.0}, []),
        (namespaced, {"prefix": "zz"}, []),
        (upper, {}, ["SINGLETON_LOCK_QUEUE_TTL"]),
        (from_object, {"prefix": "from-object"}, ["CELERY_SINGLETON_LOCK_TTL"]),
        (django_like, {"ttl": 4.0}, ["SINGLETON_LOCK_PREFIX"]),
        (Celery("empty"), {}, []),
    ]


@pytest.mark.parametrize(("app", "read", "not_read"), _apps(), ids=lambda a: getattr(a, "main", ""))
def test_the_config_reads_what_celery_s_conf_get_reads(
    app: Celery, read: dict[str, Any], not_read: list[str]
) -> None:
    """One spelling per setting, through Celery's own ``conf.get`` (whose namespace gives
    Django's ``CELERY_SINGLETON_LOCK_*``); a name the app does not read is reported."""
    config = LockConfig.of(app)
    for attribute, value in {**DEFAULT_VALUES, **read}.items():
        assert getattr(config, attribute) == value, attribute
    assert [str(p).split(" ", 1)[0] for p in config.problems] == not_read
    for problem in config.problems:
        assert "is not read by this app" in str(problem)


#: argument values of every JSON type, and of the types the canonical form writes its own way
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)


@given(st.dictionaries(st.text(), _VALUES, max_size=5))
def test_the_plain_arguments_text_is_the_encoder_s(arguments: dict[str, Any]) -> None:
    """A lock name's arguments written without the JSON encoder (strings, ints, booleans,
    ``None``) are the encoder's text of their canonical form, and anything else is left to
    the encoder: a publisher and a worker of either way make the same key."""
    text = _plain_json(arguments)
    plain = (str, int, bool, type(None))
    assert (text is None) == any(type(v) not in plain for v in arguments.values())
    if text is not None:
        encoded = {name: canonical(value, name) for name, value in arguments.items()}
        assert text == _KEY_JSON(sorted(encoded.items()))
