"""torchdeck's execution side: where `core` (training) meets `db` (storage) — Celery tasks,
the database sink and run supervision. The only package allowed to import both."""
