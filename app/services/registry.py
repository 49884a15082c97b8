"""The model registry as the pages, the CLI and the download route use it: register a finished run's verified
exports as the next version of a named model, move aliases (`production`, `staging`, …), resolve a name and an
alias or a version number to a version, list and show.

Who may do what: every member reads every model (as every run). Registering a version of an existing model and
moving its aliases: its owner (who created it, by registering its first version) or an admin (auth.can_modify, the
rule of runs and datasets); anyone who may use the dashboard may create a new model. Local mode: the local user, who
may do anything. The rule is checked here, inside the write's transaction (db/registry.py), never only by a page.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from app import auth
from app.services import projects
from app.services.artifacts import artifact_filename, artifact_problem, latest_by_kind
from app.services.broker import get_engine
from core.names import (
    ALIAS_MOVED_TASK,
    BUNDLE,
    EXPORT_FORMATS,
    EXPORT_REPORT,
    SUCCESS_STATUSES,
    TEST_ACC,
    TEST_ACC_TOP5,
    TEST_F1_MACRO,
    TEST_LOSS,
    VAL_ACC,
    WEBHOOK_URL_ENV,
)
from core.redact import redact
from db import registry as reg
from db.registry import AliasMove, ModelNotFound, ModelRecord, VersionNotFound, VersionRecord
from db.repo import RunNotFound, list_artifacts

__all__ = [
    "AliasMove",
    "ModelNotFound",
    "ModelRecord",
    "RegistryRefused",
    "RunNotFound",
    "VersionNotFound",
    "VersionRecord",
]

ROOT = Path(__file__).resolve().parents[2]
# Names and aliases appear in URLs (`/_torchdeck/models/<name>@<alias>/<file>`): no `/`, `@`, `%` or space. An alias
# starts with a letter, so it is never read as a version number.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
TEST_SCORES = (TEST_ACC, TEST_LOSS, TEST_ACC_TOP5, TEST_F1_MACRO)
log = logging.getLogger("torchdeck.app.registry")
ANNOUNCE_EXPIRES_S = 3600  # a move no jobs worker announced within an hour is old news: dropped
REPORT_MAX_BYTES = 4 << 20  # export.json is a few KB; a larger one is not read into the lineage
NO_FINGERPRINT = "not recorded: this run's dataset has no stored fingerprint"


class RegistryRefused(ValueError):
    """A registration or an alias move that is refused for what it names (not for who asks: PermissionDenied)."""


def check_model_name(name: str) -> str:
    if not isinstance(name, str) or not MODEL_NAME.match(name):
        raise RegistryRefused(
            f"model name {str(name)[:120]!r}: 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or "
            "digit (it is part of download links)"
        )
    return name


def check_alias(alias: str) -> str:
    if not isinstance(alias, str) or not ALIAS.match(alias):
        raise RegistryRefused(
            f"alias {str(alias)[:80]!r}: 1 to 64 letters, digits, '_' or '-', starting with a letter "
            "(e.g. production, staging)"
        )
    return alias


def _refuse_unless_may_modify(user: auth.User | None, action: str):
    def check(model: ModelRecord | None) -> None:
        if model is None:  # a new model: its first version makes `user` its owner
            return
        if not auth.can_modify(user, model):
            who = user.describe() if user else "an anonymous user"
            raise auth.PermissionDenied(
                f"{who} may not {action} of model {model.name}: it belongs to {model.owner}, and only its owner (a "
                f"member of project {model.project}), a maintainer of the project or an admin ({auth.ADMINS_ENV}) may"
            )

    return check


def verified_exports(run_id: str, engine: Engine) -> list[dict[str, Any]]:
    """The run's newest export of each format whose parity check passed and whose file is here unchanged in size,
    plus the export report and bundle written beside them: what a version holds."""
    newest = latest_by_kind(list_artifacts(engine, run_id))
    chosen = [
        a
        for kind, a in newest.items()
        if kind in EXPORT_FORMATS and (a.meta or {}).get("ok") and a.sha256 and artifact_problem(a) is None
    ]
    folders = {a.uri.rsplit("/", 1)[0] for a in chosen}
    extras = [
        a
        for kind, a in newest.items()
        if kind in (EXPORT_REPORT, BUNDLE) and a.sha256 and a.uri.rsplit("/", 1)[0] in folders
    ]
    return [
        {"kind": a.kind, "artifact_id": a.id, "filename": artifact_filename(a), "sha256": a.sha256, "size": a.size}
        for a in chosen + extras
    ]


def _git_dir(root: Path) -> Path | None:
    dot = root / ".git"
    if dot.is_file():  # a worktree or submodule: `gitdir: <path>`
        text = dot.read_text(errors="replace").strip()
        return (root / text.removeprefix("gitdir:").strip()).resolve() if text.startswith("gitdir:") else None
    return dot if dot.is_dir() else None


def git_commit(root: Path = ROOT) -> str | None:
    """The commit this checkout is at, read from its .git files (no git process), or None where torchdeck is not
    a git checkout (an installed package, a container image)."""
    try:
        git = _git_dir(root)
        if git is None:
            return None
        head = (git / "HEAD").read_text(errors="replace").strip()
        if head.startswith("ref:"):
            ref = head.removeprefix("ref:").strip()
            common = git / "commondir"
            base = (git / common.read_text().strip()).resolve() if common.is_file() else git
            loose = base / ref
            if loose.is_file():
                head = loose.read_text(errors="replace").strip()
            else:
                packed = (base / "packed-refs").read_text(errors="replace") if (base / "packed-refs").is_file() else ""
                head = next((ln.split()[0] for ln in packed.splitlines() if ln.endswith(" " + ref)), "")
    except OSError:
        return None
    return head if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head) else None


def _torchdeck_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchdeck")
    except PackageNotFoundError:
        return None


def _export_report(exports: list[dict[str, Any]], engine: Engine) -> dict[str, Any]:
    """export.json of the version's files (what the worker that made them recorded), or {}."""
    from app.services.artifacts import ArtifactUnavailable, read_artifact

    entry = next((e for e in exports if e["kind"] == EXPORT_REPORT), None)
    if entry is None or (entry.get("size") or 0) > REPORT_MAX_BYTES:
        return {}
    try:
        report = json.loads(read_artifact(entry["artifact_id"], engine))
    except (ArtifactUnavailable, OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def lineage(run, exports: list[dict[str, Any]] | None = None, engine: Engine | None = None) -> dict[str, Any]:
    """What a version came from, recorded at registration: the run, its spec, its dataset (and fingerprint when the
    run stored one), the code that registered it, and its validation and test scores."""
    data = dict((run.spec or {}).get("data") or {})
    summary = dict(run.summary or {})
    fingerprint = summary.get("dataset_fingerprint") or (summary.get("data") or {}).get("fingerprint")
    val = run.metrics.get(VAL_ACC)
    report = _export_report(exports or [], engine or get_engine())
    return {
        "run_id": run.id,
        "run_name": run.name,
        "run_status": run.status,
        "spec": dict(run.spec or {}),
        "spec_hash": run.spec_hash,
        "dataset": {"name": data.get("name"), "path": data.get("path")},
        "dataset_fingerprint": fingerprint,
        "dataset_fingerprint_note": None if fingerprint else NO_FINGERPRINT,
        "torchdeck_version": _torchdeck_version(),  # of the installation that registered it
        "export_versions": report.get("versions") or {},  # torch, torchdeck, … of the worker that made the files
        "class_names": report.get("class_names") or [],
        "git_commit": git_commit(),
        "scores": {
            "val_best": summary.get("best"),
            "val_acc_best": val.max_value if val is not None else None,
            "test": {k: s.last_value for k in TEST_SCORES if (s := run.metrics.get(k)) is not None},
        },
    }


def register(run_id: str, model_name: str, user: auth.User | None, engine: Engine | None = None) -> VersionRecord:
    """The run's verified exports as the next version of `model_name` (created, owned by `user`, when new).
    RegistryRefused for a run that did not finish successfully or has no verified export; PermissionDenied for
    someone who may not add versions to an existing model, or who is not a member of the run's project (a model
    is in the project of its runs); RunNotFound, also for a run of a project `user` may not see."""
    engine = engine or get_engine()
    check_model_name(model_name)
    if user is None:
        raise auth.PermissionDenied("an anonymous user may not register models")
    from app.services.runs import readable_run

    user = projects.with_roles(user, engine)
    run = readable_run(run_id, by=user, engine=engine)
    if auth.team_mode() and not auth.can_contribute(user, run.project):
        raise auth.PermissionDenied(
            f"{user.describe()} may not register models in project {run.project}: only its members, maintainers "
            f"and admins ({auth.ADMINS_ENV}) may"
        )
    if run.status not in SUCCESS_STATUSES:
        raise RegistryRefused(
            f"run {run.id} is {run.status}: only a run that finished successfully "
            f"({' or '.join(SUCCESS_STATUSES)}) can be registered"
        )
    exports = verified_exports(run.id, engine)
    if not any(e["kind"] in EXPORT_FORMATS for e in exports):
        raise RegistryRefused(
            f"run {run.id} has no verified export (a {', '.join(EXPORT_FORMATS)} file that passed its parity check "
            "and is in the artifact store): export it first (the Run page's Export now)"
        )
    check = _refuse_unless_may_modify(user, "register versions")
    return reg.add_version(
        engine,
        model_name,
        run_id=run.id,
        artifacts=exports,
        lineage=lineage(run, exports, engine),
        by=user.id,
        check=check,
    )


def set_alias(
    model_name: str, alias: str, version: int, user: auth.User | None, engine: Engine | None = None
) -> AliasMove:
    """Point `alias` at `version`, recorded in the audit; PermissionDenied unless the model's owner or an admin."""
    engine = engine or get_engine()
    check_model_name(model_name)
    check_alias(alias)
    if user is None:
        raise auth.PermissionDenied("an anonymous user may not move aliases")
    user = projects.with_roles(user, engine)
    readable_model(model_name, by=user, engine=engine)
    check = _refuse_unless_may_modify(user, "move the aliases")
    move = reg.move_alias(engine, model_name, alias, int(version), by=user.id, check=check)
    announce(move, user)
    return move


def announce(move: AliasMove, user: auth.User) -> bool:
    """Ask a jobs worker to post the move to the run-end webhook (worker/alias_notify.py), when one is set here;
    True when sent. Never raises: the move is done and recorded whatever the broker says."""
    if not os.environ.get(WEBHOOK_URL_ENV, "").strip():
        return False
    from app.services.broker import enqueue_job

    payload = {
        "model": move.model_name,
        "alias": move.alias,
        "from_version": move.from_version,
        "to_version": move.to_version,
        "moved_by": move.moved_by,
        "moved_by_name": user.describe(),
        "moved_at": move.moved_at.isoformat(),
    }
    try:
        enqueue_job(ALIAS_MOVED_TASK, {"move": payload}, expires_s=ANNOUNCE_EXPIRES_S)
    except Exception as e:  # noqa: BLE001 - a notification never undoes nor fails a move
        log.warning("alias move of %s@%s not announced: %s", move.model_name, move.alias, redact(e))
        return False
    return True


def resolve(model_name: str, ref: str | int, engine: Engine | None = None) -> VersionRecord:
    """`ref`: a version number (`3`) or an alias (`production`), resolved now. ModelNotFound, VersionNotFound."""
    engine = engine or get_engine()
    check_model_name(model_name)
    text = str(ref)
    if text.isdigit():
        return reg.get_version(engine, model_name, int(text))
    return reg.resolve_alias(engine, model_name, check_alias(text))


def version_file(version: VersionRecord, filename: str) -> dict[str, Any]:
    """The version's file called `filename` ({kind, artifact_id, filename, sha256, size}); VersionNotFound."""
    for entry in version.artifacts:
        if entry.get("filename") == filename:
            return dict(entry)
    names = ", ".join(e.get("filename", "?") for e in version.artifacts)
    raise VersionNotFound(f"version {version.version} of {version.model_name} has no file {filename[:100]!r} ({names})")


def list_models(engine: Engine | None = None, project: str | None = None) -> list[ModelRecord]:
    """Every model (of `project`, or of all) by name."""
    return reg.list_models(engine or get_engine(), project)


def readable_model(model_name: str, *, by: auth.User | None, engine: Engine | None = None) -> ModelRecord:
    """The model, or ModelNotFound when there is none or `by` may not see its project (team mode)."""
    engine = engine or get_engine()
    model = reg.get_model(engine, model_name)
    try:
        projects.check_read(projects.with_roles(by, engine), model.project, f"model {model_name!r}")
    except projects.ProjectHidden:
        raise reg.ModelNotFound(model_name) from None
    return model


def show(model_name: str, engine: Engine | None = None) -> dict[str, Any]:
    """{model, versions (oldest first), aliases (alias -> version), moves (newest first)}; ModelNotFound."""
    engine = engine or get_engine()
    check_model_name(model_name)
    return {
        "model": reg.get_model(engine, model_name),
        "versions": reg.list_versions(engine, model_name),
        "aliases": reg.aliases(engine, model_name),
        "moves": reg.alias_moves(engine, model_name),
    }


def may_modify(user: auth.User | None, model: ModelRecord) -> bool:
    """For the pages, which hide what set_alias and register would refuse."""
    return auth.can_modify(projects.with_roles(user), model)
