"""Trove settings. All configuration comes from environment variables, read here once.

Two ways to run, one code path:
- embedded default: no DATABASE_URL -> SQLite under var/ (WAL); no REDIS_URL -> Celery on the memory
  transport with an in-process worker thread (started by the `serve`/`demo` commands and the tests).
- full stack: DATABASE_URL=postgres://... and REDIS_URL=redis://... -> Postgres and real worker processes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from webapp.env import ConfigError, env_bool, env_choice, env_int, env_list, env_mapping, env_str
from webapp.var_dir import private_dir, private_file, sandbox_host_dir

BASE_DIR = Path(__file__).resolve().parent.parent
# Owner-only (webapp/var_dir.py): the database, datasets, index and spool live here.
VAR_DIR = private_dir(Path(env_str("TROVE_VAR_DIR") or BASE_DIR / "var"))

DEBUG = env_bool("DJANGO_DEBUG", False)
EMBEDDED = not env_str("DATABASE_URL")

# No production default for the secret key: the embedded mode (a laptop, a demo, tests) gets a fixed
# development key; anything with a real database must set SECRET_KEY.
_secret = env_str("SECRET_KEY")
if not _secret:
    if not (EMBEDDED or env_bool("TROVE_ALLOW_DEV_SECRET", False)):
        raise ConfigError("SECRET_KEY is required when DATABASE_URL is set (or set TROVE_ALLOW_DEV_SECRET=1)")
    _secret = "trove-development-only-secret-key-not-for-production"
SECRET_KEY = _secret

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "experience",
    "webapp.core",
    "webapp.fleets",
    "webapp.rollouts",
    "webapp.dashboard",
    "webapp.api",
    "webapp.access",
    "workers",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "webapp.api.limits.BodySizeLimitMiddleware",  # before anything reads a body (TROVE_MAX_BODY_BYTES)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_from_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise ConfigError(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (use postgres://)")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "trove",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        "CONN_MAX_AGE": 60,
        # No `SELECT 1` before the first query of every request and task: on the rollout path that is one
        # more round trip per rollout. A connection that died meanwhile (a database restart) fails that one
        # request or task, and Django then drops it; a rollout whose task failed so is re-sent (see the
        # rollout paragraph of README).
        "CONN_HEALTH_CHECKS": False,
        "TEST": {"NAME": env_str("TROVE_TEST_DATABASE_NAME") or None},
    }


def _sqlite_database() -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": private_file(VAR_DIR / "trove.sqlite3"),  # 0600, and so its -wal and -shm files
        # WAL lets the dashboard read while the in-process worker writes; the busy timeout rides out the
        # short write locks instead of failing with "database is locked".
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        "TEST": {"NAME": str(VAR_DIR / "test.sqlite3")},
    }


_database_url = env_str("DATABASE_URL")
DATABASES = {"default": _database_from_url(_database_url) if _database_url else _sqlite_database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on a missing root; assets come from finders
STATICFILES_DIRS = [BASE_DIR / "webapp" / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# --- Celery -----------------------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"  # a host named, or kombu warns "No hostname was supplied"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = False  # only idempotent tasks opt in, per task
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("TROVE_TASK_SOFT_TIME_LIMIT", 1800)
CELERY_TASK_TIME_LIMIT = env_int("TROVE_TASK_TIME_LIMIT", 1900)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("TROVE_VISIBILITY_TIMEOUT", 3600)}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env_str("TROVE_CELERY_QUEUE", "trove")
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "fleets-reconcile": {"task": "trove.fleets.reconcile_all", "schedule": 5.0},
    "rollouts-reap-stale": {"task": "trove.rollouts.reap_stale", "schedule": 15.0},
    # finished runs not yet embedded are deduplicated in batches (experience.services.dedup)
    "experience-dedup-pending": {"task": "trove.experience.dedup_pending", "schedule": 5.0, "options": {"expires": 5}},
    # finished runs get their distillation digest kept, in batches (experience.services.datasets)
    "datasets-digest-pending": {"task": "trove.datasets.digest_pending", "schedule": 5.0, "options": {"expires": 5}},
    # search documents are built after ingest, in batches (experience.services.search_index)
    "experience-search-index": {"task": "trove.search.index", "schedule": 10.0, "options": {"expires": 10}},
}
if REDIS_URL:  # the proxy's records reach the store through a Redis stream only on the full stack
    CELERY_BEAT_SCHEDULE["proxy-ingest"] = {"task": "trove.proxy.ingest", "schedule": 1.0, "options": {"expires": 5}}
# Beat's messages go to a queue of their own, so a worker of the periodic queue alone (`-Q trove.periodic`) keeps
# them off the rollouts' slots; a worker started without -Q takes both (workers/tasks/rollouts.py: a finishing
# rollout hands its slot on to the job's next one only while no message waits in a queue of its worker).
TROVE_CELERY_PERIODIC_QUEUE = env_str("TROVE_CELERY_PERIODIC_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}.periodic")
for _entry in CELERY_BEAT_SCHEDULE.values():
    _entry.setdefault("options", {})["queue"] = TROVE_CELERY_PERIODIC_QUEUE
CELERY_TASK_QUEUES: dict[str, dict[str, Any]] = {CELERY_TASK_DEFAULT_QUEUE: {}, TROVE_CELERY_PERIODIC_QUEUE: {}}

# --- Trove ------------------------------------------------------------------------------------------
TROVE_SANDBOX_BACKEND = env_choice("TROVE_SANDBOX_BACKEND", "local", ("local", "kubernetes"))
# The sandboxes' uids must pass through every parent of the sandbox root and the proxy socket: as root these
# live outside the owner-only var/, under /var/lib/trove-sandboxes/<var/'s hash> (webapp/var_dir.py).
TROVE_SANDBOX_ROOT = Path(env_str("TROVE_SANDBOX_ROOT") or sandbox_host_dir(VAR_DIR) / "sandboxes")
# Harness bundles (`manage.py harness install`), one read-only tree per preset version, shared by every
# checkout and CI run on the host; mounted into local sandboxes at /opt/trove/bundles.
TROVE_HARNESS_DIR = Path(env_str("TROVE_HARNESS_DIR") or (
    "/var/cache/trove/harnesses" if os.geteuid() == 0 else Path.home() / ".cache" / "trove" / "harnesses"))
# Turns a job's harness name into its stored form (a preset's pinned version filled in), raising ValueError for
# a name outside the harness catalogue; a setting so that the API checks jobs without importing workers.
TROVE_HARNESS_CANONICAL = "workers.harness.presets.canonical"
TROVE_KUBE_NAMESPACE = env_str("TROVE_KUBE_NAMESPACE", "trove-sandboxes")
TROVE_KUBECONFIG = env_str("KUBECONFIG")
TROVE_PROXY_HOST = env_str("TROVE_PROXY_HOST", "127.0.0.1")
TROVE_PROXY_PORT = env_int("TROVE_PROXY_PORT", 8001)
# Processes of `manage.py run_proxy` (0: one per CPU, at most 8).
TROVE_PROXY_WORKERS = env_int("TROVE_PROXY_WORKERS", 0)
# The address harnesses use to reach the proxy (may differ from where it binds, e.g. a Service name).
TROVE_PROXY_PUBLIC_URL = env_str("TROVE_PROXY_PUBLIC_URL") or f"http://{TROVE_PROXY_HOST}:{TROVE_PROXY_PORT}"
# The proxy also listens on this Unix socket (empty: it does not). Local sandboxes of a "proxy-only" template
# reach it through it and nothing else; keep it in a directory of its own (the directory is bound in).
TROVE_PROXY_SOCKET = env_str("TROVE_PROXY_SOCKET", str(sandbox_host_dir(VAR_DIR) / "proxy" / "proxy.sock")) or ""
# Where the proxy spools records it could not hand on (Redis down, the database refusing), and keeps the dead
# letter of records it can never store. Not under the socket's directory: that one is bound into sandboxes.
TROVE_PROXY_SPOOL_DIR = Path(env_str("TROVE_PROXY_SPOOL_DIR") or VAR_DIR / "proxy-spool")
# The Redis stream of proxy records; empty: named after the database (webapp/proxy/locations.py).
TROVE_PROXY_STREAM = env_str("TROVE_PROXY_STREAM", "") or ""
# Where a registered model endpoint's key may come from (webapp/rollouts/endpoints.py): an environment variable
# whose name starts with this prefix, or a file directly inside this directory (empty: no file keys).
# Step-level labels curators give (experience/services/step_labels.py); runs with an excluding one on any step
# are left out of dataset builds.
TROVE_STEP_LABELS = env_list("TROVE_STEP_LABELS", ["good-step", "wrong-tool", "hallucinated-output", "reward-hack"])
TROVE_EXCLUDING_STEP_LABELS = env_list("TROVE_EXCLUDING_STEP_LABELS", ["reward-hack"])
TROVE_REVIEW_CLAIM_SECONDS = env_int("TROVE_REVIEW_CLAIM_SECONDS", 900)  # a review queue claim's lifetime
TROVE_MODEL_KEY_ENV_PREFIX = env_str("TROVE_MODEL_KEY_ENV_PREFIX", "TROVE_MODEL_KEY_") or ""
if not re.fullmatch(r"[A-Z][A-Z0-9_]{3,}_", TROVE_MODEL_KEY_ENV_PREFIX):
    raise ConfigError("TROVE_MODEL_KEY_ENV_PREFIX must be upper case, at least 5 characters, ending in '_' "
                      f"(got {TROVE_MODEL_KEY_ENV_PREFIX!r}): it is what keeps SECRET_KEY out of a key reference")
TROVE_MODEL_SECRETS_DIR = env_str("TROVE_MODEL_SECRETS_DIR", "") or ""
TROVE_DEMO_MODEL_PORT = env_int("TROVE_DEMO_MODEL_PORT", 8002)
TROVE_DEMO_SERVE = env_str("DEMO_SERVE", "1")
TROVE_ROLLOUT_HEARTBEAT_S = env_int("TROVE_ROLLOUT_HEARTBEAT_S", 10)
TROVE_ROLLOUT_STALE_S = env_int("TROVE_ROLLOUT_STALE_S", 60)
TROVE_ROLLOUT_MAX_ATTEMPTS = env_int("TROVE_ROLLOUT_MAX_ATTEMPTS", 3)
# A queued rollout of an open job whose message was sent this long ago, while the broker queue is empty, is
# sent again (its message was lost, e.g. Redis lost data); a duplicate is a no-op (trove.rollouts.reap_stale).
TROVE_ROLLOUT_RESEND_S = env_int("TROVE_ROLLOUT_RESEND_S", 120)
# A finishing rollout's task runs the job's next waiting one itself rather than through the broker (0: off).
TROVE_ROLLOUT_HANDOFF = env_int("TROVE_ROLLOUT_HANDOFF", 1)
# The largest request body, uploads included, for the API and the dashboard alike (webapp/api/limits.py).
TROVE_MAX_BODY_BYTES = env_int("TROVE_MAX_BODY_BYTES", 32 * 1024 * 1024)
TROVE_MAX_STEPS_PER_TRAJECTORY = env_int("TROVE_MAX_STEPS_PER_TRAJECTORY", 20000)
TROVE_MAX_CONTENT_CHARS = env_int("TROVE_MAX_CONTENT_CHARS", 4 * 1024 * 1024)
TROVE_DATASET_DIR = Path(env_str("TROVE_DATASET_DIR") or VAR_DIR / "datasets")
TROVE_INDEX_DIR = Path(env_str("TROVE_INDEX_DIR") or VAR_DIR / "index")
# RL samples of calls recorded without token ids are re-tokenised with the tokenizer their endpoint names
# here, "endpoint=/path/tokenizer.json,..." (an operator's setting: no job or dataset spec names a file).
TROVE_RL_TOKENIZERS = env_mapping("TROVE_RL_TOKENIZERS")
TROVE_DEDUP_EMBEDDER = env_choice("TROVE_DEDUP_EMBEDDER", "lexical", ("lexical", "minilm"))  # dedup README
DATA_UPLOAD_MAX_MEMORY_SIZE = TROVE_MAX_BODY_BYTES

# --- REST API ---------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Scoped tokens (trv_…) first: the plain DRF token authenticator would refuse their keys.
        "webapp.access.authentication.ScopedTokenAuthentication",
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "webapp.access.permissions.TokenScopes",
    ],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # DRF's JSON parser with the importers' nesting limit: a deeply nested body is a 400, not a RecursionError.
    "DEFAULT_PARSER_CLASSES": [
        "webapp.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "webapp.api.exception_handlers.trove_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.CursorPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Trove API",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema maps every endpoint: signed-in people and tokens only (the docs page also needs a session).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Every operation documents the errors it can answer with (webapp/api/schema.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "webapp.api.schema.document_error_responses"],
    # Swagger UI assets are served from the installed sidecar package, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Jobs and rollouts both have a "status" enum: name them apart in the schema.
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "webapp.rollouts.models.RolloutJob.Status",
        "RolloutStatusEnum": "webapp.rollouts.models.Rollout.Status",
        "FleetStatusEnum": "webapp.fleets.models.Fleet.Status",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
    "loggers": {"trove": {"level": env_str("TROVE_LOG_LEVEL", "INFO"), "propagate": True}},
}
