"""`torchdeck doctor`: is this deployment able to run anything? One line per check, ✓ or ✗, and
for each failure what is wrong and how to fix it. Exit status 1 when something is wrong.

It checks what every run needs, in the order a run needs it: the database (reachable, schema
current), the broker (Redis answers), live workers and their devices (their heartbeat rows in
the database), the artifact store (a probe written, read back and removed through db/artifacts/),
and in team mode the sign-in settings. The worker checks are doctor_workers.py; a check's outcome and its lines,
check.py. Reads the same environment as the app and the workers; never imports torch or the worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from app.cli.check import Check, first_line
from app.cli.doctor_workers import check_workers
from core.names import MAX_RUN_GPUS, RUN_QUEUES, multi_gpu_queues

# A blackholed database host must not hang the doctor for the OS's two-minute TCP timeout.
CONNECT_TIMEOUT_S = 5


def _shown_db(url: str) -> str:
    from sqlalchemy.engine import make_url

    from db.engine import normalize_url

    try:
        return make_url(normalize_url(url)).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as given, minus anything after '@'
        return url.split("@")[-1]


def _shown_broker(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a malformed address
    except ValueError:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.rsplit('@', 1)[-1]}"
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


# --- database -------------------------------------------------------------------------------------


def _with_connect_timeout(url: str) -> str:
    """Postgres URLs get libpq's connect_timeout unless they set one."""
    from sqlalchemy.engine import make_url

    from db.engine import normalize_url

    try:
        sa_url = make_url(normalize_url(url))
    except Exception:  # noqa: BLE001 - make_engine reports it
        return url
    if sa_url.get_backend_name() != "postgresql" or "connect_timeout" in sa_url.query:
        return url
    return sa_url.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_S)}).render_as_string(hide_password=False)


def check_database() -> tuple[Check, object | None]:
    """Reachable, and at the schema revision this code needs. Returns the engine when usable."""
    from db.engine import database_url, make_engine
    from db.migrate import current_revision, head_revision

    url = database_url()
    shown = _shown_db(url)
    env_hint = (
        "TORCHDECK_DATABASE_URL"
        if os.environ.get("TORCHDECK_DATABASE_URL")
        else "TORCHDECK_DATABASE_URL (unset: the local SQLite file)"
    )
    try:
        engine = make_engine(_with_connect_timeout(url))
    except Exception as e:  # noqa: BLE001 - an unsupported or malformed URL
        return Check(
            "database",
            False,
            f"{shown}: {first_line(e)}",
            f"set {env_hint} to postgresql://USER:PASSWORD@HOST:5432/DB or sqlite:////path/torchdeck.db",
        ), None
    try:
        with engine.connect():
            pass
    except Exception as e:  # noqa: BLE001 - refused, unknown host, bad password, missing database, ...
        return Check(
            "database",
            False,
            f"cannot connect to {shown}: {first_line(e)}",
            f"check host, port, user, password and database name in {env_hint}, and that the server "
            "is running (team mode: `docker compose ps postgres`)",
        ), None
    head = head_revision()
    try:
        current = current_revision(engine)
    except Exception as e:  # noqa: BLE001
        return Check(
            "database",
            False,
            f"{shown}: cannot read the schema revision: {first_line(e)}",
            "check that this user may read the database",
        ), None
    if current != head:
        if current is None:
            detail = f"{shown}: reachable, but it has no torchdeck tables (this version needs schema {head})"
        else:
            detail = f"{shown}: schema revision {current}, this version needs {head}"
        fix = (
            "run `torchdeck db upgrade` with the same TORCHDECK_DATABASE_URL "
            "(team mode: `docker compose run --rm migrate`)"
        )
        from db.migrate import _known

        if current is not None and not _known(current):
            fix = "a newer torchdeck upgraded this database: run that newer version (a schema cannot go back)"
        return Check("database", False, detail, fix), engine
    return Check("database", True, f"{shown}: reachable, schema {head} (current)"), engine


# --- broker ---------------------------------------------------------------------------------------


def check_broker() -> tuple[Check, dict[str, int]]:
    """Redis answers PING; returns the number of messages waiting per queue."""
    from app.services.broker import broker_url

    url = broker_url()
    shown = _shown_broker(url)
    fix = (
        "start Redis (team mode: `docker compose up -d redis`; local: `torchdeck up`) or set "
        "TORCHDECK_BROKER_URL to a reachable one, e.g. redis://:PASSWORD@HOST:6379/0"
    )
    if not url.startswith(("redis://", "rediss://", "redis+socket://", "unix://")):
        return Check("broker", False, f"{shown}: unsupported broker URL", fix), {}
    import redis

    client_url = "unix://" + url[len("redis+socket://") :] if url.startswith("redis+socket://") else url
    try:
        client = redis.Redis.from_url(client_url, socket_connect_timeout=3, socket_timeout=3)  # connects lazily
    except ValueError as e:
        return Check("broker", False, f"{shown}: not a valid Redis URL ({first_line(e)})", fix), {}
    try:
        client.ping()
        waiting = {q: int(client.llen(q)) for q in RUN_QUEUES}
        # The multi-GPU queues (gpu-x2 ..) are named only when a message waits there: most hosts have none.
        waiting.update({q: n for q in multi_gpu_queues(MAX_RUN_GPUS) if (n := int(client.llen(q)))})
    except redis.AuthenticationError as e:
        return Check(
            "broker",
            False,
            f"{shown}: Redis refused the password: {first_line(e)}",
            "put Redis's password (REDIS_PASSWORD) in TORCHDECK_BROKER_URL: redis://:PASSWORD@HOST:6379/0",
        ), {}
    except Exception as e:  # noqa: BLE001 - refused, timeout, unknown host, ...
        return Check("broker", False, f"cannot reach {shown}: {first_line(e)}", fix), {}
    finally:
        client.close()
    queued = ", ".join(f"{q} {n}" for q, n in waiting.items())
    return Check("broker", True, f"{shown}: reachable (messages waiting: {queued})"), waiting


# --- artifact store -------------------------------------------------------------------------------


def artifact_location() -> str:
    """$TORCHDECK_ARTIFACTS (a folder or s3://bucket/prefix), default $TORCHDECK_HOME/artifacts."""
    from db.engine import data_home

    return os.environ.get("TORCHDECK_ARTIFACTS") or str(data_home() / "artifacts")


def check_artifacts() -> Check:
    """A probe written, read back and deleted through the store every run uses (db/artifacts/)."""
    location = artifact_location()
    from db.artifacts import open_store

    try:
        result = open_store(location).check()  # never raises for I/O; StoreError for a bad URL
    except Exception as e:  # noqa: BLE001
        return Check(
            "artifacts",
            False,
            f"{location}: {first_line(e)}",
            "set TORCHDECK_ARTIFACTS to a folder or s3://bucket/prefix",
        )
    if result.ok:
        return Check("artifacts", True, f"{result.url}: write, read back and delete work")
    return Check(
        "artifacts", False, result.message, result.fix or "set TORCHDECK_ARTIFACTS to a store this host can write"
    )


# --- sign-in --------------------------------------------------------------------------------------


def check_sign_in() -> Check | None:
    """Team mode needs the OpenID Connect settings (app/auth.py); local mode has no sign-in."""
    from app import auth

    try:
        team = auth.team_mode()
    except auth.AuthNotConfigured as e:
        return Check("sign-in", False, str(e), f"set {auth.MODE_ENV} to local or team")
    if not team:
        return None
    missing = auth.missing_config()
    if missing:
        return Check(
            "sign-in",
            False,
            f"{auth.MODE_ENV}=team, but {', '.join(missing)} not set",
            "register torchdeck as an OpenID Connect client with your provider (redirect URI "
            "https://<dashboard>/oauth2callback) and set those variables (see .env.example)",
        )
    admins = ", ".join(sorted(auth.admins())) or "none (set TORCHDECK_ADMINS)"
    check = Check(
        "sign-in", True, f"team mode, OpenID Connect client {os.environ[auth.OIDC_ENV['client_id']]}; admins: {admins}"
    )
    rules = auth.allow_list()
    if rules:
        listed = "; ".join(f"{env}={','.join(entries)}" for env, entries in rules.items())
        check.notes.append(f"members: the admins and who matches {listed}")
    else:
        check.notes.append(
            f"warning: no allow-list ({', '.join(auth.ALLOW_ENVS)}): everyone who can sign in at the "
            "provider is a member of this dashboard"
        )
    return check


# --- all together ---------------------------------------------------------------------------------


def run_checks(emit: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check, in order; `emit` sees each as soon as it is done (the CLI prints it)."""
    results: list[Check] = []

    def add(c: Check) -> None:
        results.append(c)
        if emit:
            emit(c)

    db_check, engine = check_database()
    add(db_check)
    add(check_broker()[0])
    if engine is not None and db_check.ok:
        for c in check_workers(engine):
            add(c)
    else:
        add(Check("workers", None, "not checked: they are listed in the database, which failed above"))
    add(check_artifacts())
    sign_in = check_sign_in()
    if sign_in is not None:
        add(sign_in)
    if engine is not None:
        engine.dispose()
    return results


def doctor() -> None:
    """Check the database, the broker, the workers and the artifact store; say what is wrong and the fix."""
    import typer

    results = run_checks(lambda c: typer.echo("\n".join(c.lines())))
    failed = [c for c in results if c.ok is False]
    if failed:
        typer.echo(f"{len(failed)} problem(s): {', '.join(c.name for c in failed)}")
        raise typer.Exit(1)
    typer.echo("all checks passed")
