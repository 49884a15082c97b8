"""`python -m app.cli ...`: the `torchdeck` command without its console script (tests/e2e/conftest.py starts the
dashboard this way)."""

import sys

from app.cli import main

sys.exit(main())
