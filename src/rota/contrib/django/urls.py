"""The dashboard's URLs: ``path("rota/", include("rota.contrib.django.urls"))``."""

from __future__ import annotations

from django.urls import re_path

from .views import dashboard

app_name = "rota"
urlpatterns = [re_path(r"^(?P<path>.*)$", dashboard, name="dashboard")]
