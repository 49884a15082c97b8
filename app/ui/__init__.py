"""Helpers of the Streamlit dashboard: schema-driven forms, cached queries, charts, views. The plain logic they
show is in app/present/, what they do in app/services/.

Nothing here imports torch: work that needs it (pre-flight, export) runs in a subprocess."""
