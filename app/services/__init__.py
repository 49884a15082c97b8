"""What the dashboard and the CLI do, whichever asks: the rules are enforced here (the pages only hide what
these refuse). Torch-free: runs and jobs are sent to the workers by task name.

- runs.py: submit, cancel, tag and annotate, follow, delete and re-run a run; admission.py: the gate every new
  run passes (bounds, the files it may read: paths.py, the queued-runs limit);
- broker.py: the Celery client, the queue a run waits in and the live workers that serve it (in words, with
  what a worker takes, as the Workers page and `torchdeck doctor` say it: queue_words.py), the database engine;
- artifacts.py: artifacts read and streamed by their opaque id; owners.py: how an owner is shown;
- sweeps.py: sweeps and seed groups; jobs.py: the torch jobs asked of the jobs workers (pre-flight, export);
  datasets.py: uploaded datasets (checked with zip_directory.py, previewed by dataset_previews.py).

Import what you use from its module: nothing is imported here (sweeps.py brings Optuna, only when used)."""
