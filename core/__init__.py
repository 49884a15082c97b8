"""torchdeck's training core: runs with no database, broker or UI (`python -m core SPEC.yaml`)."""
