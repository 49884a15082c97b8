"""The live charts of a running run, in one place: the chart component that updates in place (chart.py), the
series a dashboard process holds once per run for everyone watching it (series.py), and the HTTP route the Run
page's chart frame polls for what changed (route.py, mounted by app/server.py).

Nothing is imported here: app/server.py imports the route at its first request only (the dashboard's caches,
imported before Streamlit's runtime exists, would get a storage of their own)."""
