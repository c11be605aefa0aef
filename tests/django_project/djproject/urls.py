from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("rota/", include("rota.contrib.django.urls")),
    path("tenants/<slug:slug>/record/", views.record_view),
]
