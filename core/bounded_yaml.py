"""YAML from users, read within bounds: a spec file, an uploaded spec, a `--set` value.

An alias (`*a`) makes YAML a graph: nine lines of nested aliases expand to billions of nodes once
anything copies or validates the data. The document is composed first, and refused (before anything is
built from it) when it is too long, or when its expanded tree would exceed MAX_NODES; a real run spec
has a few hundred. Torch-free: the dashboard and the CLI read specs with it.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_BYTES = 1 << 20  # a spec is a few KB
MAX_NODES = 100_000  # after expanding aliases
MAX_DEPTH = 64


class YamlRefused(ValueError):
    """The YAML is too large or too deep to read; the message says which limit and how far it went."""


def load(text: str, what: str = "the YAML") -> Any:
    """safe_load within the bounds above (YamlRefused beyond them; yaml.YAMLError for a syntax error)."""
    if len(text) > MAX_BYTES:
        raise YamlRefused(f"{what} is {len(text):,} characters long; at most {MAX_BYTES:,} are read")
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlRefused(f"{what} nests deeper than {MAX_DEPTH} levels") from None
        if node is None:
            return None
        _check_size(node, what)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_size(root: yaml.Node, what: str) -> None:
    """The number of nodes of the tree the graph expands to, counted with memoised subtree sizes (an alias
    is the same node object as its anchor), so counting itself stays cheap."""
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
            total = 1 + sum(sizes.get(id(c), 0) for c in children)
            if total > MAX_NODES:
                raise YamlRefused(f"{what} expands to more than {MAX_NODES:,} values (aliases referring to aliases?); "
                                  "write the spec out without YAML anchors")
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
