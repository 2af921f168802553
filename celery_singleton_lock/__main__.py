"""``python -m celery_singleton_lock --url redis://... list|show|release|purge``."""

from ._ops.cli import main

if __name__ == "__main__":
    main()
