"""A small Django project with auth that mounts the locks page at ``/locks/`` (the web page
tests serve it from a subprocess: Django's settings are per process)."""
