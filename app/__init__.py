"""torchdeck's user-facing side: the CLI and the Streamlit dashboard. Never imports torch at module level."""
