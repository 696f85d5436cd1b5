"""YAML as fedrc reads it: safe, a key given twice in one mapping refused, and bounded.

`yaml.safe_load` keeps the last of two equal keys and says nothing, so a params.yaml that sets
`train.lr` twice trains with whichever comes second. `UniqueKeyLoader` (a `yaml.SafeLoader`)
refuses such a document before building it, naming the key by its dotted path and both lines.

Aliases share one node, so 700 bytes of `&a [*a, *a, ...]` (a "billion laughs") expand to
billions of values in anything that walks the result (a message that prints it, json.dumps);
an alias that refers to itself never ends. A document is refused before it is built when it
would expand to more than `MAX_VALUES` values, and one nested deeper than the parser can
follow is refused too (`TooBig`, `TooDeep`), instead of hanging or a RecursionError.
"""

from __future__ import annotations

from typing import Any

import yaml

MERGE = "tag:yaml.org,2002:merge"
MAX_VALUES = 100_000  # a params.yaml holds hundreds; a sweep's lists, thousands


class TooBig(yaml.YAMLError):
    """A document whose aliases expand it beyond `MAX_VALUES` values (or without end)."""


class TooDeep(yaml.YAMLError):
    """A document nested deeper than the parser can follow."""


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping: `key` is its dotted path, `lines` where (1-based)."""

    def __init__(self, key: str, lines: tuple[int, int]) -> None:
        super().__init__(f"{key}: given twice (lines {lines[0]} and {lines[1]})")
        self.key, self.lines = key, lines


class UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a document in which a mapping holds a key twice."""

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_expansion(node)
        self._refuse_duplicates(node, "", set())
        return super().construct_document(node)

    def _refuse_duplicates(self, node: yaml.Node, where: str, seen_nodes: set[int]) -> None:
        if id(node) in seen_nodes:  # an alias of a node already checked (or of itself)
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == MERGE:
                    self._refuse_duplicates(value_node, where, seen_nodes)
                    continue
                name = where + self._key_name(key_node)
                key = self._key(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKey(name, (seen[key], line))
                seen[key] = line
                self._refuse_duplicates(value_node, name + ".", seen_nodes)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._refuse_duplicates(item, f"{where.removesuffix('.')}[{i}].", seen_nodes)

    def _key(self, node: yaml.Node) -> Any:
        """The key as YAML compares it (`16` and `0x10` are one key), or its text."""
        if isinstance(node, yaml.ScalarNode):
            try:
                value = self.construct_object(node)
                hash(value)
                return (type(value).__name__, value)
            except (yaml.YAMLError, TypeError, ValueError):
                pass
        return (node.tag, repr(node.value))

    @staticmethod
    def _key_name(node: yaml.Node) -> str:
        return str(node.value) if isinstance(node, yaml.ScalarNode) else f"<{node.tag}>"


def _refuse_expansion(root: yaml.Node) -> None:
    """`TooBig` when the document, its aliases expanded, holds more than `MAX_VALUES` values
    or an alias inside the node it names; each node is sized once, so this takes linear time."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes and not children_done:
            if sizes[id(node)] < 0:
                raise TooBig("an alias (*name) refers to the node that holds it: it never ends")
            continue
        children = _children(node)
        if not children_done:
            sizes[id(node)] = -1  # being sized: met again below it, it holds itself
            stack.append((node, True))
            stack.extend((child, False) for child in children)
            continue
        sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
        if sizes[id(node)] > MAX_VALUES:
            raise TooBig(
                f"its aliases (*name) expand it to more than {MAX_VALUES:,} values; write the "
                "values out, or use fewer aliases"
            )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def load(text: str) -> Any:
    """The document in `text`; raises `DuplicateKey`, `TooBig`, `TooDeep`, or yaml.YAMLError
    for bad syntax."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: plain data only
    except RecursionError:
        raise TooDeep("nested too deeply to read (hundreds of levels of [ ] or { })") from None


def where(error: yaml.YAMLError) -> str:
    """A YAML error in one line, with the line and column it names: "line 3, column 5:
    expected ',' or ']', but got '<stream end>'"."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
