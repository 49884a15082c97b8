"""What every section of a run spec shares: a strict pydantic model, and names checked against the catalog."""

from __future__ import annotations

from pydantic import AfterValidator, BaseModel, ConfigDict

from core import catalog


def registered(kind: str, known: tuple[str, ...]) -> AfterValidator:
    """A name from a closed registry (core/catalog.py); any other is refused with the list of known ones."""

    def check(name: str) -> str:
        if name not in known:
            raise ValueError(catalog.unknown(kind, name, known))
        return name

    return AfterValidator(check)


class Section(BaseModel):
    # extra="forbid": a misspelt key is an error, never silently ignored.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
