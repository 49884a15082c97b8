"""torchdeck's user-facing side: the CLI and the Streamlit dashboard. Never imports torch at module level.

Laid out by job:
- cli/: the `torchdeck` command line (its commands, the console sink, doctor, the process starter);
- services/: what the pages and the CLI do, and the rules they enforce (runs, the gate of new runs, the broker,
  artifacts, owners, sweeps, jobs, datasets);
- present/: what the pages show, as plain functions (text, figures, seed groups, the New run form's schema, rules
  and hints);
- ui/ and app_pages/: the Streamlit views and pages (main.py registers the pages; auth.py: who is acting);
- live/: the live charts (the component, the shared series, their HTTP route);
- web/: the front door and the downloads' route, mounted with the live route by server.py."""
