"""Names that every package shares, defined once: metric key builders and the limits they keep.

Torch-free and importing nothing of ours, so the UI, the database layer and the workers can all
use it. A metric key is born here when part of it comes from the user (a class name): whatever the
name, the key fits the store (`MAX_METRIC_KEY` characters) and stays unique per name.
"""

from __future__ import annotations

import hashlib

# The longest metric key the store accepts (the metric tables' key column).
MAX_METRIC_KEY = 200
CLASS_ACC_PREFIX = "val/acc_class/"
# The longest class name that appears in a per-class key unchanged; uploads refuse longer names.
MAX_CLASS_NAME = MAX_METRIC_KEY - len(CLASS_ACC_PREFIX)
_DIGEST = 10  # hex characters of the name's hash kept in a shortened key


def class_acc_key(class_name: str) -> str:
    """`val/acc_class/<class name>`; a name too long for the store is cut and suffixed with a hash of the
    whole name (`~` + 10 hex digits), so two long names sharing a prefix still get different keys."""
    return CLASS_ACC_PREFIX + short_name(class_name, MAX_CLASS_NAME)


def short_name(name: str, limit: int) -> str:
    """`name` when it has at most `limit` characters, else its first characters + `~` + a hash of all of it."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return f"{name[: limit - _DIGEST - 1]}~{digest}"
