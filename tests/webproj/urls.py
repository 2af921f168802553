"""The locks page at ``/locks/``, and a bare login form at ``/accounts/login/``."""

from typing import Any

from django.contrib.auth import authenticate, login
from django.http import HttpResponse, HttpResponseRedirect
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt  # type: ignore[untyped-decorator]  # django: unannotated
def login_view(request: Any) -> HttpResponse:
    """POST username and password: logged in and sent on to ``next``."""
    if request.method == "POST":
        user = authenticate(
            request, username=request.POST["username"], password=request.POST["password"]
        )
        if user is not None:
            login(request, user)
            return HttpResponseRedirect(request.GET.get("next", "/locks/"))
    return HttpResponse("<form method=post>log in</form>", status=200)


urlpatterns = [
    path("accounts/login/", login_view),
    path("locks/", include("celery_singleton_lock.web.django")),
]
