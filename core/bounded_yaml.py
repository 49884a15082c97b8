"""YAML from users, read within bounds: a spec file, an uploaded spec, a `--set` value.

An alias (`*a`) makes YAML a graph: nine lines of nested aliases expand to billions of nodes once
anything copies or validates the data. The document is composed first, and refused (before anything is
built from it) when it is too long, or when its expanded tree would exceed MAX_NODES; a real run spec
has a few hundred. Torch-free: the dashboard and the CLI read specs with it.

Numbers are read as YAML 1.2 reads them: decimal, hexadecimal (0x), octal and binary integers (PyYAML's
YAML 1.1 forms `0755`, `1_000` too), and floats. Base-60 numbers (`1:30`, YAML 1.1 only) are read as
strings: PyYAML converts them in quadratic time (a megabyte of `1:0:0:…` is 18 s of CPU). A number of
more than MAX_NUMBER_CHARS characters is refused, naming its field, before anything converts it (Python
refuses integers of more than 4,300 digits with a ValueError), as is a value whose explicit tag
(`!!int abc`, `!!timestamp x`) does not fit it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # a spec is a few KB
MAX_NODES = 100_000  # after expanding aliases
MAX_DEPTH = 64
MAX_NUMBER_CHARS = 100  # a seed is 10 digits; no field takes a number of 100

_TAG = "tag:yaml.org,2002:"
INT, FLOAT, BOOL, TIMESTAMP = (_TAG + t for t in ("int", "float", "bool", "timestamp"))
# PyYAML's YAML 1.1 patterns without the base-60 forms (`[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+`).
_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")


class YamlRefused(ValueError):
    """The YAML is too large or too deep to read; the message says which limit and how far it went."""


def _bounded_loader(base: type) -> type:
    """`base` (PyYAML's SafeLoader, or its libyaml twin) with numbers resolved as the module says, that stops
    composing after MAX_NODES nodes: a megabyte of `[1,1,1,…]` is half a million of them (4 s, 200 MB)."""
    resolvers = {
        first: [(tag, rx) for tag, rx in pairs if tag not in (INT, FLOAT)]
        for first, pairs in base.yaml_implicit_resolvers.items()
    }

    def resolve(self: Any, kind: type, value: Any, implicit: Any) -> str:
        self.composed += 1  # once per node composed (an alias is not composed again)
        if self.composed > MAX_NODES:
            raise YamlRefused(f"{self.what} holds more than {MAX_NODES:,} values")
        return base.resolve(self, kind, value, implicit)

    loader = type(
        f"Bounded{base.__name__}",
        (base,),
        {"yaml_implicit_resolvers": resolvers, "resolve": resolve, "composed": 0, "what": "the YAML"},
    )
    loader.add_implicit_resolver(INT, _INT, list("-+0123456789"))  # int("0o17", 8) reads YAML 1.2's octal too
    loader.add_implicit_resolver(FLOAT, _FLOAT, list("-+0123456789."))
    return loader


# libyaml parses five times faster than PyYAML's Python scanner (a 1 MB document: 0.08 s against 0.45 s) and
# caps nesting at 1,000 levels itself, so its recursion stays bounded as well.
_Loader = _bounded_loader(yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader)


def load(text: str, what: str = "the YAML") -> Any:
    """safe_load within the bounds above (YamlRefused beyond them; yaml.YAMLError for a syntax error)."""
    if len(text) > MAX_BYTES:
        raise YamlRefused(f"{what} is {len(text):,} characters long; at most {MAX_BYTES:,} are read")
    loader = _Loader(text)
    loader.what = what
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlRefused(f"{what} nests deeper than {MAX_DEPTH} levels") from None
        except yaml.scanner.ScannerError as e:
            if "maximum nesting depth" in str(e.problem):  # libyaml's own cap (1,000)
                raise YamlRefused(f"{what} nests deeper than {MAX_DEPTH} levels") from None
            raise
        if node is None:
            return None
        _check_size(node, what)
        try:
            return loader.construct_document(node)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:  # whatever _check_scalar missed
            raise YamlRefused(
                f"{what} holds a value that cannot be read ({e.__class__.__name__}: {str(e)[:120]})"
            ) from None
    finally:
        loader.dispose()


def _check_size(root: yaml.Node, what: str) -> None:
    """The number of nodes of the tree the graph expands to, counted with memoised subtree sizes (an alias
    is the same node object as its anchor), so counting itself stays cheap. Each number, boolean and
    timestamp is checked once (_check_scalar) before anything converts it."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        if id(node) in sizes:
            continue
        if depth > MAX_DEPTH:
            raise YamlRefused(f"{what} nests deeper than {MAX_DEPTH} levels")
        children = _children(node)
        if done or not children:
            if not done and node.tag in _CHECKED:
                _check_scalar(node, what, root)
            total = 1 + sum(sizes.get(id(c), 0) for c in children)
            if total > MAX_NODES:
                raise YamlRefused(
                    f"{what} expands to more than {MAX_NODES:,} values (aliases referring to aliases?); "
                    "write the spec out without YAML anchors"
                )
            sizes[id(node)] = total
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


_CHECKED = frozenset((INT, FLOAT, BOOL, TIMESTAMP))


def _check_scalar(node: yaml.ScalarNode, what: str, root: yaml.Node) -> None:
    """Refuse a number too long to convert cheaply, and a tagged value its constructor would choke on."""
    tag, value = node.tag, node.value
    if tag in (INT, FLOAT) and len(value) > MAX_NUMBER_CHARS:
        problem = f"is a number of {len(value):,} characters; at most {MAX_NUMBER_CHARS} are read"
    elif tag in (INT, FLOAT) and _SEXAGESIMAL.match(value):
        problem = f"is {value[:24]!r}, a base-60 number, which is not read: write it in decimal"
    elif not {
        INT: lambda: _INT.match(value),
        FLOAT: lambda: _FLOAT.match(value),
        BOOL: lambda: value.lower() in yaml.SafeLoader.bool_values,
        TIMESTAMP: lambda: yaml.SafeLoader.timestamp_regexp.match(value),
    }[tag]():
        problem = f"is {value[:24]!r}, which is not a {tag.removeprefix(_TAG)}"
    else:
        return
    path = _path_to(root, node)
    raise YamlRefused(f"{what}: {path} {problem}" if path else f"{what} {problem}")


def _path_to(root: yaml.Node, target: yaml.Node) -> str:
    """Where `target` first appears below `root`: `seed`, `train.epochs`, `schedule.milestones[2]`, `a key of
    train`. Only when refusing: it walks the distinct nodes once more."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((c, f"{path}[{i}]") for i, c in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                name = str(key.value)[:60] if isinstance(key, yaml.ScalarNode) else "?"
                stack += [(value, f"{path}.{name}" if path else name), (key, f"a key of {path}" if path else "a key")]
    return ""
