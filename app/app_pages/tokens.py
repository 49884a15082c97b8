"""API tokens: a person's own scripts log runs into torchdeck through the MLflow client with one of these as their
bearer token (team mode). Made here, its secret shown once; listed and revoked here (app/ui/tokens_view.py; the
rules are app/services/tokens.py's). Local mode needs none: the page says so and shows what a script sets."""

from __future__ import annotations

from app.ui import tokens_view

tokens_view.main()
