"""A leader scheduler that says it still stands by every 1.5 s instead of every minute, so
the test of that reminder takes seconds (``-S tests.beatproj.schedulers:ChattyLeaderScheduler``).
Subclassing is how a project tunes the leader scheduler's class attributes."""

from __future__ import annotations

from celery_singleton_lock.beat import LeaderScheduler


class ChattyLeaderScheduler(LeaderScheduler):
    standby_log_every = 1.5
