"""torchdeck's storage: runs, metrics, events, artifacts in SQLite or Postgres.

    from db.engine import make_engine
    from db.migrate import check_schema
    from db import repo

    engine = make_engine()            # TORCHDECK_DATABASE_URL or a SQLite file
    check_schema(engine)              # refuses an out-of-date schema
    run = repo.create_run(engine, spec_dict)

Imports none of core, worker or app.
"""
