"""Operations: what operators see and do (``locks``: list, show, force-release, purge) and the
command line (``cli``: ``celery -A proj locks ...``, ``python -m celery_singleton_lock``)."""
