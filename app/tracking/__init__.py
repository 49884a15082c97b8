"""MLflow's tracking REST API, answered by the dashboard's server, so that a person's own script logs its runs into
torchdeck through the unmodified `mlflow` client (and what builds on it: PyTorch Lightning's MLFlowLogger,
Hugging Face Trainer's MLflow callback, `mlflow.pytorch.autolog()`):

    MLFLOW_TRACKING_URI=http://127.0.0.1:8501/_torchdeck/mlflow    (team mode: the dashboard's public URL)
    MLFLOW_TRACKING_TOKEN=<a personal API token>                     (team mode only: the API tokens page)

Served under PATH by app/server.py (the route mechanism of the live charts' feed). The version answered is
MLflow's REST API 2.0 (as spoken by mlflow 2.x and 3.x clients), these endpoints of it (app/tracking/route.py's
ENDPOINTS):
- experiments: create, get, get-by-name, search (an experiment is a torchdeck project: app/tracking/experiments.py);
- runs: create, get, update (a script ends its run there), delete, search (a subset of MLflow's filter language:
  app/tracking/search.py), log-metric, log-parameter, set-tag, delete-tag, log-batch (the hot path: db/external.py
  writes it through the metric sink's batched, idempotent append); metrics/get-history;
- artifacts, through MLflow's artifact proxy (mlflow-artifacts): upload, list, download, into torchdeck's artifact
  store (app/tracking/artifacts.py).
Every other path under PATH is answered with MLflow's own error shape, `{"error_code": "ENDPOINT_NOT_FOUND",
"message": ...}` and 404, so the client's message says what is missing.

Who logs: in local mode the person at this machine (the front door answers this machine only, as for the pages); in
team mode the person whose personal API token the request carries as its bearer token (app/services/tokens.py),
bound by the same rules as on the pages: their projects' roles, the input bounds of app/tracking/protocol.py."""

PATH = "/_torchdeck/mlflow"
