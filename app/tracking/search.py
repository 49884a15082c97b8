"""The part of MLflow's search filter language torchdeck reads, and the pages of a search's answer.

A filter is clauses joined by AND: `<entity>.<key> <op> <value>`, the entity one of `metrics`, `params`, `tags`,
`attributes` (and their singular forms; `run` for attributes), a key written plainly (`tags.mlflow.runName`) or
quoted with backticks or double quotes when it holds other characters (metrics.`val loss`); the operators
=, !=, <, <=, >, >= (numbers compare as numbers), LIKE and ILIKE (`%` any text, `_` one character), and IN / NOT IN
with a parenthesised list; values in single or double quotes, or a number. A metric compares its latest value.
What else MLflow reads (OR, the dataset entities) is refused with INVALID_PARAMETER_VALUE saying so, never
ignored: a filter that is not understood never returns runs it did not ask for.

Order: a list of `<entity>.<key> [ASC|DESC]`; runs without the value go last. Page tokens: the offset of the next
page, opaque to the client."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.tracking.protocol import invalid

ENTITIES = {
    "metric": "metric",
    "metrics": "metric",
    "param": "param",
    "params": "param",
    "parameter": "param",
    "parameters": "param",
    "tag": "tag",
    "tags": "tag",
    "attribute": "attribute",
    "attributes": "attribute",
    "attr": "attribute",
    "run": "attribute",
}
_KEY = r"`[^`]+`|\"[^\"]+\"|[\w.\-/:]+"
_VALUE = r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\((?:[^()'\"]|'[^']*'|\"[^\"]*\")*\)"
_CLAUSE = re.compile(
    rf"\s*(?P<entity>[A-Za-z_]+)\.(?P<key>{_KEY})\s*"
    rf"(?P<op>!=|>=|<=|=|<|>|(?i:not\s+ilike|not\s+like|ilike|like|not\s+in|in)\b)\s*(?P<value>{_VALUE})\s*",
)
_AND = re.compile(r"(?i)and\b")


@dataclass(frozen=True)
class Clause:
    entity: str  # metric, param, tag, attribute
    key: str
    op: str  # upper case: =, !=, <, <=, >, >=, LIKE, ILIKE, NOT LIKE, NOT ILIKE, IN, NOT IN
    value: Any  # str, float, or a tuple of str for IN


def parse(text: str) -> list[Clause]:
    """The clauses of a filter ([] for none); INVALID_PARAMETER_VALUE for what cannot be read."""
    clauses: list[Clause] = []
    at, text = 0, text.strip()
    while at < len(text):
        found = _CLAUSE.match(text, at)
        if found is None:
            raise invalid(f"Error on parsing filter '{text}': cannot read it from '{text[at : at + 40]}' on")
        clauses.append(_clause(found))
        at = found.end()
        if at < len(text):
            joined = _AND.match(text, at)
            if joined is None:
                raise invalid(f"Error on parsing filter '{text}': clauses are joined by AND (OR is not supported)")
            at = joined.end()
            if at >= len(text.rstrip()):
                raise invalid(f"Error on parsing filter '{text}': it ends with AND")
    return clauses


def _clause(found: re.Match) -> Clause:
    entity = ENTITIES.get(found["entity"].lower())
    if entity is None:
        raise invalid(
            f"Invalid entity '{found['entity']}' in the filter: metrics, params, tags or attributes (datasets are not "
            "searched here)"
        )
    key = found["key"]
    if key[0] in '`"':
        key = key[1:-1]
    op = " ".join(found["op"].upper().split())
    value = _value(found["value"], op)
    if entity == "metric" and op not in ("=", "!=", "<", "<=", ">", ">="):
        raise invalid(f"metrics.{key}: a metric is compared with =, !=, <, <=, > or >= and a number")
    if entity == "metric" and not isinstance(value, float):
        raise invalid(f"metrics.{key}: compare it with a number, not {found['value']}")
    return Clause(entity, key, op, value)


def _value(raw: str, op: str) -> Any:
    if raw.startswith("("):
        if op not in ("IN", "NOT IN"):
            raise invalid(f"a list {raw} goes with IN or NOT IN")
        items = re.findall(r"'((?:[^']|'')*)'|\"((?:[^\"]|\"\")*)\"", raw)
        return tuple((a or b).replace("''", "'") for a, b in items)
    if op in ("IN", "NOT IN"):
        raise invalid(f"IN takes a parenthesised list of quoted values, not {raw}")
    if raw[0] in "'\"":
        return raw[1:-1].replace(raw[0] * 2, raw[0])
    return float(raw)


def matches(clause: Clause, have: Any) -> bool:
    """Whether a value (None: the run has none) satisfies the clause. Text compares as text, unless the clause's
    value is a number: then as numbers (a value that is not one does not match)."""
    if have is None:
        return clause.op in ("!=", "NOT IN", "NOT LIKE", "NOT ILIKE") and clause.entity != "metric"
    op, want = clause.op, clause.value
    if op in ("IN", "NOT IN"):
        return (str(have) in want) == (op == "IN")
    if "LIKE" in op:
        flags = re.IGNORECASE | re.DOTALL if "ILIKE" in op else re.DOTALL
        pattern = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in str(want))
        return bool(re.fullmatch(pattern, str(have), flags)) == (not op.startswith("NOT"))
    if isinstance(want, float):
        try:
            have = float(have)
        except (TypeError, ValueError):
            return False
    else:
        have = str(have)
    return {
        "=": have == want,
        "!=": have != want,
        "<": have < want,
        "<=": have <= want,
        ">": have > want,
        ">=": have >= want,
    }[op]


def order_keys(order_by: Sequence[str]) -> list[tuple[str, str, bool]]:
    """`order_by` as (entity, key, descending) triples."""
    keys = []
    for item in order_by or ():
        found = re.fullmatch(rf"\s*(?P<entity>[A-Za-z_]+)\.(?P<key>{_KEY})(?:\s+(?P<dir>(?i:asc|desc)))?\s*", item)
        entity = ENTITIES.get(found["entity"].lower()) if found else None
        if found is None or entity is None:
            raise invalid(f"Invalid order_by clause '{item}': <entity>.<key> [ASC|DESC]")
        key = found["key"][1:-1] if found["key"][0] in '`"' else found["key"]
        keys.append((entity, key, (found["dir"] or "asc").lower() == "desc"))
    return keys


def page(items: list, limit: int, token: Any) -> tuple[list, str | None]:
    """One page of `items` from the token's offset, and the next page's token (None: this is the last)."""
    offset = offset_of(token)
    more = offset + limit < len(items)
    return items[offset : offset + limit], token_of(offset + limit) if more else None


def offset_of(token: Any) -> int:
    """The offset a page token stands for (0 for none); INVALID_PARAMETER_VALUE for one not ours."""
    if not token:
        return 0
    try:
        offset = int(json.loads(base64.urlsafe_b64decode(str(token).encode()))["offset"])
    except (ValueError, KeyError, TypeError):
        raise invalid(f"Invalid page token {token!r}") from None
    if offset < 0:
        raise invalid(f"Invalid page token {token!r}")
    return offset


def token_of(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()
