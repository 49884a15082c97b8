"""Helpers of the Streamlit dashboard: schema-driven forms, cached queries, charts, formatting.

Nothing here imports torch: work that needs it (pre-flight, export) runs in a subprocess."""
