"""Run the project for a test: migrate, make the users (``staff`` and ``viewer``, password
``pw``), then serve it with wsgiref on a free port, printed as ``serving on PORT``."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webproj.settings")

import django

django.setup()

from wsgiref.simple_server import make_server  # noqa: E402

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from web_helpers import QuietHandler, ThreadingServer  # noqa: E402

call_command("migrate", verbosity=0)
User.objects.create_user("staff", password="pw", is_staff=True)
User.objects.create_user("viewer", password="pw")
server = make_server(
    "127.0.0.1", 0, get_wsgi_application(), server_class=ThreadingServer,
    handler_class=QuietHandler,
)  # fmt: skip
print(f"serving on {server.server_port}", flush=True)
sys.stdout.flush()
server.serve_forever()
