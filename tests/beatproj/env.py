"""The environment variables the beat subprocesses read (set by the test that starts them)."""

from __future__ import annotations

#: ``redis://127.0.0.1:PORT`` (no database): broker on 0, the locks on 2
REDIS_ENV = "CSL_BEATPROJ_REDIS"
#: the SQLite file of the Django project
DB_ENV = "CSL_BEATPROJ_DB"
#: the leader lock's lease (``singleton_lock_ttl``), seconds
TTL_ENV = "CSL_BEATPROJ_TTL"
#: the period of the periodic task ``prepare`` adds, seconds
PERIOD_ENV = "CSL_BEATPROJ_PERIOD"

BROKER_DB, LOCK_DB = 0, 2
#: the periodic task's name (its schedule entry's name) and the task it sends
ENTRY = "csl-tick"
TASK = "beatproj.tick"

#: RedBeat's app (``tests.beatproj.redbeat_app``): a file whose appearance makes the leader of
#: :class:`beatproj.schedulers.PauseOnCueLeaderScheduler` pause at its next send
PAUSE_CUE_ENV = "CSL_BEATPROJ_PAUSE_CUE"
#: RedBeat's app: the scheduler the leader wraps, when not RedBeat's (``module:Class``)
WRAPPED_ENV = "CSL_BEATPROJ_WRAPPED"
#: RedBeat's app: RedBeat's schedule on 4, what the beats published and the worker ran on 3
REDBEAT_DB, DATA_DB = 4, 3
#: RedBeat's app: its entry (due every second), its task and the worker's queue
REDBEAT_ENTRY = "rb-tick"
REDBEAT_TASK = "rbproj.tick"
REDBEAT_QUEUE = "rbproj"
#: RedBeat's app: lists in DATA_DB, one JSON item per publish (``pid``, ``t``, ``id``: which
#: beat, when, the task id) and per run on the worker (``id``, ``t``)
PUBLISHED, RAN = "published", "ran"
