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
