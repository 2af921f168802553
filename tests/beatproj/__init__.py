"""A small Django project for the beat tests: django-celery-beat's ``DatabaseScheduler`` on
SQLite, run by real ``celery beat`` subprocesses under the leader scheduler.

``settings`` reads where Redis and the database are from the environment (the names in
:mod:`beatproj.env`), ``app`` is the Celery app those subprocesses load
(``celery -A tests.beatproj.app beat``), ``prepare`` migrates the database and adds the periodic
task, and ``harness`` holds what the test process uses to start beats and read what they sent.
``schedulers`` holds leader schedulers that put a fault at an exact point of a send, and
``redbeat_app`` is a second Celery app (no Django): RedBeat's ``RedBeatScheduler`` under the
leader scheduler, for ``tests/test_beat_redbeat.py``.
Nothing here is imported by the package itself.
"""
