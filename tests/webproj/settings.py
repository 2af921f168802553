"""Settings of the web page tests' Django project: auth and sessions on SQLite, the locks page
at ``/locks/``, the Celery app ``webproj.celery:app`` on the test's redis-server
(``CSL_WEB_REDIS``, ``redis://host:port``)."""

import os

SECRET_KEY = "web-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "webproj.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["CSL_WEB_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
LOGIN_URL = "/accounts/login/"

_redis = os.environ.get("CSL_WEB_REDIS", "redis://127.0.0.1:1")
CELERY_BROKER_URL = f"{_redis}/0"
CELERY_RESULT_BACKEND = f"{_redis}/1"
CELERY_SINGLETON_LOCK_REDIS_URL = f"{_redis}/2"
CELERY_SINGLETON_LOCK_WEB_APP = "webproj.celery:app"

# a server error's traceback goes to the subprocess's output (the test shows it on failure)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"handlers": ["console"], "level": "ERROR"}},
}
