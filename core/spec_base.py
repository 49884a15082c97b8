"""What every section of a run spec shares: a strict pydantic model, and names checked against the catalog."""

from __future__ import annotations

from typing import Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from core import catalog
from core.names import TEST_PREFIX


def registered(kind: str, known: tuple[str, ...]) -> AfterValidator:
    """A name from a closed registry (core/catalog.py); any other is refused with the list of known ones."""

    def check(name: str) -> str:
        if name not in known:
            raise ValueError(catalog.unknown(kind, name, known))
        return name

    return AfterValidator(check)


def never_test(field: str) -> BeforeValidator:
    """For a field that selects (early stopping's monitor, a sweep's objective, and through them the best checkpoint
    and pruning): a test/* metric is refused with why, before the field's own list of choices is checked."""

    def check(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(TEST_PREFIX):
            raise ValueError(
                f"{field}={value}: the test split's scores are read once, at the end of the run, so that they stay "
                f"an unbiased estimate; nothing that selects (early stopping, the best checkpoint, a sweep's "
                f"objective, pruning) may see them. Use the validation split's val/{value[len(TEST_PREFIX) :]}"
            )
        return value

    return BeforeValidator(check)


class Section(BaseModel):
    # extra="forbid": a misspelt key is an error, never silently ignored.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
