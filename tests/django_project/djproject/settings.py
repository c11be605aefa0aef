"""A small real Django project using rota's task backend: its tables live in the schema
ROTA_DJANGO_SCHEMA (one per test process, made by tests/django_project/conftest.py),
rota's in SCHEMA_rota, on DATABASE_URL."""

import os
from datetime import timedelta

from psycopg.conninfo import conninfo_to_dict

SCHEMA = os.environ["ROTA_DJANGO_SCHEMA"]
_db = conninfo_to_dict(os.environ.get("DATABASE_URL",
                                      "postgresql://postgres@127.0.0.1:5432/test"))

SECRET_KEY = "rota-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "djproject.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rota.contrib.django",
    "tenants",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "test"),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        # The project's tables in its schema; `manage.py test` (ROTA_DJANGO_PUBLIC)
        # uses a fresh test database's public schema instead.
        "OPTIONS": ({} if os.environ.get("ROTA_DJANGO_PUBLIC")
                    else {"options": f"-c search_path={SCHEMA}"}),
        "TEST": {"NAME": f"test_{SCHEMA}"},
        # A worker runs many tasks a second: keep its threads' connections (the
        # default, 0, reconnects for every task as for every request).
        "CONN_MAX_AGE": 60,
    },
    # Not PostgreSQL: a task backend on it refuses to enqueue (ImproperlyConfigured).
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
TASKS = {
    "default": {
        # Tests switch it (ROTA_TASKS_BACKEND) to rota's ImmediateBackend or DummyBackend.
        "BACKEND": os.environ.get("ROTA_TASKS_BACKEND", "rota.contrib.django.RotaBackend"),
        "QUEUES": ["default", "bands", "fair"],
        "OPTIONS": {
            "SCHEMA": f"{SCHEMA}_rota",
            "GROUPS": {"MODEL": "tenants.Tenant", "GROUP_ID": "slug", "PLAN": "plan",
                       "ACTIVE": "active"},
            "QUEUE": {"max_attempts": 3},
            "WORKER": {"concurrency": 4},
        },
    },
    # Short timeouts, for sync tasks that outlive them (seconds): a 4 s platform
    # timeout, a 1 s handler timeout, a 20 s stale window.
    "short": {
        "BACKEND": "rota.contrib.django.RotaBackend",
        "QUEUES": ["slow"],
        "OPTIONS": {
            "SCHEMA": f"{SCHEMA}_rota",
            "QUEUE": {"stale_after": timedelta(seconds=20)},
            "WORKER": {"platform_timeout": 4, "handler_timeout": 1,
                       "heartbeat_every": 0.5},
        },
    },
}
# Not PostgreSQL: a task backend on it refuses to enqueue (ImproperlyConfigured), and
# fails Django's system checks (rota.E001), so only the pytest process has it: every
# manage.py command would stop on that error.
if os.environ.get("ROTA_DJANGO_WITH_LITE"):
    TASKS["lite"] = {
        "BACKEND": "rota.contrib.django.RotaBackend",
        "OPTIONS": {"DATABASE": "lite", "SCHEMA": f"{SCHEMA}_rota"},
    }
