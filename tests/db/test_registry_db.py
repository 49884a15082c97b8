"""The registry's tables (migration 0009) and queries, on SQLite and on Postgres: versions numbered per model, an
alias moved with every move audited, a refusing check that writes nothing, and 0009 down and up again."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from db import registry as reg
from db import repo
from db.engine import make_engine
from db.migrate import downgrade, head_revision, upgrade

TABLES = {"registered_model", "model_version", "model_alias", "model_alias_move"}


def _allow(_model) -> None:
    return None


def _version(engine, name: str, by: str = "ana") -> reg.VersionRecord:
    run = repo.create_run(engine, {"lr": 0.1}, owner=by)
    files = [{"kind": "onnx", "artifact_id": "a1", "filename": "model.onnx", "sha256": "0" * 64, "size": 3}]
    return reg.add_version(
        engine, name, run_id=run.id, artifacts=files, lineage={"run_id": run.id}, by=by, check=_allow
    )


def test_versions_are_numbered_per_model_and_the_first_registrant_owns_it(engine) -> None:
    assert [_version(engine, "digits").version for _ in range(3)] == [1, 2, 3]
    assert _version(engine, "pets", by="bo").version == 1
    assert reg.get_model(engine, "digits").owner == "ana" and reg.get_model(engine, "pets").owner == "bo"
    listed = reg.list_models(engine)
    assert [(m.name, m.latest_version) for m in listed] == [("digits", 3), ("pets", 1)]
    v2 = reg.get_version(engine, "digits", 2)
    assert v2.artifacts[0]["filename"] == "model.onnx" and v2.lineage["run_id"] == v2.run_id
    with pytest.raises(reg.VersionNotFound):
        reg.get_version(engine, "digits", 4)
    with pytest.raises(reg.ModelNotFound):
        reg.get_version(engine, "nope", 1)


def test_every_alias_move_is_audited_and_resolved_at_once(engine) -> None:
    for _ in range(2):
        _version(engine, "digits")
    first = reg.move_alias(engine, "digits", "production", 1, by="ana", check=_allow)
    assert (first.from_version, first.to_version) == (None, 1)
    assert reg.resolve_alias(engine, "digits", "production").version == 1
    reg.move_alias(engine, "digits", "production", 2, by="admin", check=_allow)
    assert reg.resolve_alias(engine, "digits", "production").version == 2
    moves = reg.alias_moves(engine, "digits")
    assert [(m.alias, m.from_version, m.to_version, m.moved_by) for m in moves] == [
        ("production", 1, 2, "admin"),
        ("production", None, 1, "ana"),
    ]
    assert reg.list_models(engine)[0].aliases == {"production": 2}
    with pytest.raises(reg.VersionNotFound):
        reg.move_alias(engine, "digits", "production", 9, by="ana", check=_allow)
    with pytest.raises(reg.VersionNotFound, match="no alias 'staging'"):
        reg.resolve_alias(engine, "digits", "staging")


def test_a_refusing_check_writes_nothing(engine) -> None:
    first = _version(engine, "digits")

    def refuse(model) -> None:
        raise PermissionError(f"not yours: {model.owner}")

    with pytest.raises(PermissionError, match="not yours: ana"):
        reg.move_alias(engine, "digits", "production", 1, by="eve", check=refuse)
    with pytest.raises(PermissionError):
        reg.add_version(engine, "digits", run_id=first.run_id, artifacts=[], lineage={}, by="eve", check=refuse)
    assert reg.aliases(engine, "digits") == {} and reg.alias_moves(engine, "digits") == []
    assert [v.version for v in reg.list_versions(engine, "digits")] == [1]


def test_0009_goes_down_and_up_again(database_url: str) -> None:
    assert upgrade(database_url) == head_revision()
    engine = make_engine(database_url)
    try:
        assert TABLES <= set(inspect(engine).get_table_names())
        assert downgrade(database_url, "0008") == "0008"
        inspect_after = set(inspect(engine).get_table_names())
        assert not TABLES & inspect_after and "run" in inspect_after
        upgrade(database_url)
        _version(engine, "digits")
        assert reg.list_models(engine)[0].name == "digits"
    finally:
        engine.dispose()


def test_registrations_at_once_take_distinct_numbers_and_one_owner(engine) -> None:
    """Four people registering to one new model at the same moment: one creates it, the numbers are 1 to 8 once
    each, and every later one was judged against the model's owner as it then was."""
    from concurrent.futures import ThreadPoolExecutor

    runs = [repo.create_run(engine, {"lr": 0.1}, owner=f"p{i}") for i in range(4)]
    judged: list[str | None] = []

    def register(i: int) -> list[int]:
        def check(model) -> None:
            judged.append(None if model is None else model.owner)

        got = []
        for _ in range(2):
            v = reg.add_version(engine, "digits", run_id=runs[i].id, artifacts=[], lineage={}, by=f"p{i}", check=check)
            got.append(v.version)
        return got

    with ThreadPoolExecutor(4) as pool:
        numbers = sorted(n for got in pool.map(register, range(4)) for n in got)
    assert numbers == list(range(1, 9))
    owner = reg.get_model(engine, "digits").owner
    assert judged.count(None) == 1 and [o for o in judged if o is not None] == [owner] * 7


def test_a_run_deleted_while_it_is_being_registered_leaves_no_version_of_nothing(engine) -> None:
    import threading

    from sqlalchemy import delete, select

    from db.engine import writer
    from db.errors import RunNotFound
    from db.models import Run
    from db.registry_tables import ModelVersion

    run = repo.create_run(engine, {"lr": 0.1}, owner="ana")
    files = [{"kind": "onnx", "artifact_id": "a1", "filename": "model.onnx", "sha256": "0" * 64, "size": 3}]
    outcome: list[BaseException | reg.VersionRecord] = []

    def register() -> None:
        try:
            outcome.append(
                reg.add_version(engine, "m", run_id=run.id, artifacts=files, lineage={}, by="ana", check=_allow)
            )
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome.append(e)

    with writer(engine).connect() as deleting:  # delete_run's transaction, held open: the run's row locked
        deleting.begin()
        deleting.execute(select(Run.id).where(Run.id == run.id).with_for_update())
        deleting.execute(delete(Run).where(Run.id == run.id))
        thread = threading.Thread(target=register)
        thread.start()
        if engine.dialect.name == "postgresql":  # the registration waits on the row (SQLite: on the write lock)
            _wait_for_a_lock_wait(engine, lambda: outcome)
        deleting.commit()
    thread.join(60)
    assert not thread.is_alive() and isinstance(outcome[0], RunNotFound)
    with engine.connect() as c:
        assert c.execute(select(ModelVersion.run_id)).all() == []


def _wait_for_a_lock_wait(engine, outcome) -> None:
    """Until a session of this database waits on a lock (bounded: a minute). Each look in a transaction of its own:
    pg_stat_activity is a snapshot taken once per transaction."""
    import time

    from sqlalchemy import text

    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    deadline = time.monotonic() + 60
    while True:
        with engine.connect() as watch:
            if watch.execute(waiting).scalar():
                return
        assert time.monotonic() < deadline, f"the registration never waited on the run's row: {outcome()}"
        time.sleep(0.05)
