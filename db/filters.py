"""The Runs page's filter expression: `val/acc > 0.9 and optim.lr <= 1e-3 and status == completed`.

A clause compares one thing with one value, and clauses are joined by `and`:

- a metric: `val/acc > 0.9` compares the series' last value; `max(val/acc)`, `min(...)`, `last(...)` choose
  its largest, smallest or last value. A key holding a dot or a character the expression uses is written in
  quotes: `max("val/acc_class/cat dog") >= 0.8`. A run without the series matches no metric clause.
- a spec field (a hyperparameter), dotted as in the run spec: `optim.lr <= 1e-3`, `train.batch_size == 128`,
  `model.name == resnet18`, `model.pretrained == true`, `seed != 42`.
- `status`, `owner`, `tag`, `sweep` and `parent` (a run's parent run id), with == or !=.

`parse` is plain logic (the words, the operators, the values, each error saying what is wrong and where);
`conditions` turns the clauses into WHERE clauses that mean the same on SQLite and Postgres.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
import types
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from sqlalchemy import exists, func, not_, select

from core.catalog import DATASET_NAMES, MODEL_NAMES
from core.config import RunSpec
from db.models import Account, MetricRollup, Run, RunTag
from db.rollup import WHOLE_SERIES_LEVEL
from db.types import RUN_STATUSES

OPERATORS = (">", ">=", "<", "<=", "==", "!=")
EQUALITY = ("==", "!=")
AGGREGATES = {"last": "last_value", "max": "max_value", "min": "min_value"}
FIELDS = ("status", "owner", "tag", "sweep", "parent")  # the run's own columns (and its tags)
MAX_LENGTH = 2000  # characters of an expression
_USE = "use one of " + " ".join(OPERATORS)
_TOKEN = re.compile(r"""\s*(?:(?P<quoted>"[^"]*"|'[^']*')|(?P<op>[<>=!]+)|(?P<paren>[()])|(?P<word>[^\s<>=!()"']+))""")


class FilterError(ValueError):
    """An expression that cannot be read: what is wrong, where (a 1-based character position), and what to write."""


@dataclass(frozen=True)
class Clause:
    kind: str  # "metric", "spec", or one of FIELDS
    name: str  # the metric key, the dotted spec field, or the field
    op: str  # one of OPERATORS
    value: float | bool | str
    aggregate: str = "last"  # metrics: one of AGGREGATES


@dataclass(frozen=True)
class _Token:
    kind: str  # "quoted", "op", "paren", "word"
    text: str  # quotes removed
    at: int  # 1-based position of its first character

    @property
    def shown(self) -> str:
        return repr(self.text) if self.kind != "quoted" else repr(f'"{self.text}"')


# --- the spec's fields -----------------------------------------------------------------------------------
def _leaf(annotation: Any) -> tuple[str, tuple[Any, ...]]:
    """What a spec field holds: ("number" | "bool" | "text" | "list", the Literal choices if any)."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (Union, types.UnionType) and len(args) == 1:
        return _leaf(args[0])
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        kind = "text" if all(isinstance(c, str) for c in choices) else "number"
        return kind, choices
    if annotation is bool:
        return "bool", ()
    if annotation in (int, float):
        return "number", ()
    if annotation is str:
        return "text", ()
    return "list", ()


@lru_cache(maxsize=1)
def spec_fields() -> dict[str, tuple[str, tuple[Any, ...]]]:
    """Every leaf field of the run spec, dotted (`optim.lr`), with what it holds; the spec's own `name` left out
    (a run's name is its own column)."""
    out: dict[str, tuple[str, tuple[Any, ...]]] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.")
            elif f"{prefix}{name}" != "name":
                out[f"{prefix}{name}"] = _leaf(annotation)

    walk(RunSpec, "")
    out["data.name"], out["model.name"] = ("text", DATASET_NAMES), ("text", MODEL_NAMES)  # the catalog's names
    return out


def _sections() -> set[str]:
    return {path.split(".")[0] for path in spec_fields() if "." in path}


def _close(word: str, known: list[str]) -> str:
    near = difflib.get_close_matches(word, known, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(near)}?" if near else ""


# --- reading ---------------------------------------------------------------------------------------------
def _tokens(text: str) -> list[_Token]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            at = len(text) - len(text[pos:].lstrip()) + 1
            raise FilterError(f"unclosed quote at position {at}: close it with the same quote")
        kind = str(m.lastgroup)
        raw = m.group(kind)
        at = m.start(kind) + 1
        out.append(_Token(kind, raw[1:-1] if kind == "quoted" else raw, at))
        pos = m.end()
    return out


def parse(text: str | None) -> tuple[Clause, ...]:
    """The clauses of an expression (none for an empty one); FilterError saying what is wrong and where."""
    if text is None or not text.strip():
        return ()
    if len(text) > MAX_LENGTH:
        raise FilterError(f"the filter is {len(text):,} characters long; the limit is {MAX_LENGTH:,}")
    tokens, clauses, i = _tokens(text), [], 0
    while True:
        clause, i = _clause(tokens, i, len(text) + 1)
        clauses.append(clause)
        if i == len(tokens):
            return tuple(clauses)
        joiner = tokens[i]
        if joiner.kind == "word" and joiner.text.lower() == "or":
            raise FilterError(f"'or' at position {joiner.at}: only 'and' joins conditions; run two filters instead")
        if not (joiner.kind == "word" and joiner.text.lower() == "and"):
            raise FilterError(
                f"expected 'and' at position {joiner.at}, found {joiner.shown}: join conditions with "
                "'and', and quote a value that holds spaces"
            )
        if i + 1 == len(tokens):
            raise FilterError(f"nothing after 'and' at position {joiner.at}: add a condition or remove it")
        i += 1


def _clause(tokens: list[_Token], i: int, end: int) -> tuple[Clause, int]:
    """The clause starting at tokens[i], and the index after it."""
    subject, i = _subject(tokens, i, end)
    if i == len(tokens):
        raise FilterError(f"expected an operator at position {end} after {subject[1]!r}; {_USE}")
    op = tokens[i]
    if op.kind != "op":
        raise FilterError(f"expected an operator at position {op.at}, found {op.shown}; {_USE}")
    if op.text not in OPERATORS and op.text != "=":
        raise FilterError(f"unknown operator {op.text!r} at position {op.at}; {_USE}")
    if i + 1 == len(tokens) or tokens[i + 1].kind not in ("word", "quoted"):
        where = tokens[i + 1].at if i + 1 < len(tokens) else end
        raise FilterError(f"expected a value at position {where} after {op.text!r}")
    value = tokens[i + 1]
    return _typed(subject, "==" if op.text == "=" else op.text, value), i + 2


def _subject(tokens: list[_Token], i: int, end: int) -> tuple[tuple[str, str, str, int], int]:
    """(kind, name, aggregate, position) of what a clause compares, and the index after it."""
    if i == len(tokens):
        raise FilterError(f"expected a condition at position {end}, such as val/acc > 0.9")
    first = tokens[i]
    if first.kind == "quoted":
        return ("metric", first.text, "last", first.at), i + 1
    if first.kind != "word":
        raise FilterError(f"expected a metric or a field at position {first.at}, found {first.shown}")
    word = first.text
    if i + 1 < len(tokens) and tokens[i + 1].text == "(" and tokens[i + 1].kind == "paren":
        if word.lower() not in AGGREGATES:
            raise FilterError(
                f"unknown function {word!r} at position {first.at}; use one of "
                f"{', '.join(f'{a}(...)' for a in AGGREGATES)}"
            )
        inner = tokens[i + 2] if i + 2 < len(tokens) else None
        close = tokens[i + 3] if i + 3 < len(tokens) else None
        if (
            inner is None
            or inner.kind not in ("word", "quoted")
            or close is None
            or close.kind != "paren"
            or close.text != ")"
        ):
            raise FilterError(
                f"{word}( at position {first.at} needs a metric key and a closing ')', as in {word.lower()}(val/acc)"
            )
        return ("metric", inner.text, word.lower(), first.at), i + 4
    return (_kind_of(word, first.at), word, "last", first.at), i + 1


def _kind_of(word: str, at: int) -> str:
    """A field, a spec field (dotted, or a top-level one such as seed) or else a metric key."""
    if word in FIELDS:
        return word
    if word in spec_fields():
        return "spec"
    if "/" in word:
        return "metric"
    if "." in word:
        section = word.split(".")[0]
        known = (
            [p for p in spec_fields() if p.startswith(f"{section}.")] if section in _sections() else list(spec_fields())
        )
        hint = _close(word, known) or (
            f"; {section} has {', '.join(known[:8])}…"
            if section in _sections()
            else f"; spec sections: {', '.join(sorted(_sections()))}"
        )
        raise FilterError(
            f"unknown spec field {word!r} at position {at}{hint} (a metric key with a dot is "
            f'written in quotes: "{word}" > 0.5)'
        )
    return "metric"


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return None if math.isnan(number) else number


def _typed(subject: tuple[str, str, str, int], op: str, value: _Token) -> Clause:
    kind, name, aggregate, at = subject
    if kind == "metric":
        number = _number(value.text)
        if number is None:
            hint = _close(name, [*FIELDS, *spec_fields()]) if "/" not in name else ""
            raise FilterError(
                f"{name!r} is a metric and is compared with a number, not {value.shown} (position {value.at}){hint}"
            )
        return Clause("metric", name, op, number, aggregate)
    if kind != "spec" or spec_fields()[name][0] != "number":
        if op not in EQUALITY:
            raise FilterError(f"{name} at position {at} is compared with == or !=, not {op!r}")
    if kind == "status" and value.text not in RUN_STATUSES:
        raise FilterError(f"unknown status {value.text!r} at position {value.at}; known: {', '.join(RUN_STATUSES)}")
    if kind != "spec":
        return Clause(kind, kind, op, value.text)
    return Clause("spec", name, op, _spec_value(name, value))


def _spec_value(name: str, value: _Token) -> float | bool | str:
    holds, choices = spec_fields()[name]
    if holds == "number":
        number = _number(value.text)
        if number is None:
            raise FilterError(f"{name} is a number: {value.shown} at position {value.at} is not one")
        return number
    if holds == "bool":
        if value.text.lower() not in ("true", "false"):
            raise FilterError(f"{name} is true or false: {value.shown} at position {value.at} is neither")
        return value.text.lower() == "true"
    if holds == "list":
        raise FilterError(f"{name} holds a list: it cannot be compared with one value")
    if choices and value.text not in choices:
        raise FilterError(
            f"{name} is one of {', '.join(map(str, choices))}: {value.shown} at position {value.at} is not"
        )
    return value.text


# --- SQL -------------------------------------------------------------------------------------------------
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}


def _compare(column: Any, op: str, value: Any) -> Any:
    return _OPS[op](column, value)


def _where(clause: Clause) -> Any:
    if clause.kind == "metric":
        whole = MetricRollup
        column = getattr(whole, AGGREGATES[clause.aggregate])
        return exists().where(
            whole.run_id == Run.id,
            whole.level == WHOLE_SERIES_LEVEL,
            whole.key == clause.name,
            _compare(column, clause.op, clause.value),
        )
    if clause.kind == "spec":
        path = Run.spec[tuple(clause.name.split("."))]
        if isinstance(clause.value, bool):
            return _compare(path.as_boolean(), clause.op, clause.value)
        column = path.as_float() if isinstance(clause.value, float) else path.as_string()
        return _compare(column, clause.op, clause.value)
    if clause.kind == "tag":
        tagged = Run.id.in_(select(RunTag.run_id).where(RunTag.tag == clause.value))
        return tagged if clause.op == "==" else not_(tagged)
    if clause.kind == "owner":  # the stored key, or the verified e-mail of the account it names
        keys = select(Account.key).where(func.lower(Account.email) == str(clause.value).lower())
        mine = (Run.owner == clause.value) | Run.owner.in_(keys)
        return mine if clause.op == "==" else not_(mine)
    column = {"status": Run.status, "sweep": Run.sweep_id, "parent": Run.parent_id}[clause.kind]
    if clause.op == "==":
        return column == clause.value
    return (column != clause.value) if clause.kind == "status" else column.is_(None) | (column != clause.value)


def conditions(text: str | None) -> list[Any]:
    """The WHERE clauses of an expression (db.listing.list_runs's `expression`); FilterError when unreadable."""
    return [_where(clause) for clause in parse(text)]
