"""How an owner is shown on the pages: an account that signed in here by its name (and verified e-mail), never
by its `<issuer>#<subject>` key; any other owner as it is stored."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from sqlalchemy import Engine

from app.services.broker import get_engine


def owner_labels(keys: Iterable[str | None], engine: Engine | None = None) -> dict[str, str]:
    """How to show each owner: an account that signed in here by its name (and verified e-mail), never by
    its `<issuer>#<subject>` key; any other owner (an e-mail stored before identities were keyed, a local
    user name, a CLI user) as it is stored."""
    from db.repo import accounts

    wanted = {k for k in keys if k}
    found = accounts(engine or get_engine(), wanted) if wanted else {}
    labels = {}
    for key in wanted:
        a = found.get(key)
        if a is None:
            labels[key] = key
        elif a.email:
            labels[key] = f"{a.name} ({a.email})" if a.email.lower() != a.name.lower() else a.name
        else:  # a name anyone may choose at the provider: marked, and told apart from a look-alike by its key
            labels[key] = f"{a.name} (unverified {hashlib.sha256(key.encode()).hexdigest()[:6]})"
    return labels


def owner_label(owner: str | None, engine: Engine | None = None) -> str:
    """One owner as owner_labels shows it ('' for none)."""
    return owner_labels([owner], engine).get(owner, "") if owner else ""
