"""YAML as fedrc reads it: safe, and a key given twice in one mapping is refused.

`yaml.safe_load` keeps the last of two equal keys and says nothing, so a params.yaml that sets
`train.lr` twice trains with whichever comes second. `UniqueKeyLoader` (a `yaml.SafeLoader`)
refuses such a document before building it, naming the key by its dotted path and both lines.
"""

from __future__ import annotations

from typing import Any

import yaml

MERGE = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping: `key` is its dotted path, `lines` where (1-based)."""

    def __init__(self, key: str, lines: tuple[int, int]) -> None:
        super().__init__(f"{key}: given twice (lines {lines[0]} and {lines[1]})")
        self.key, self.lines = key, lines


class UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a document in which a mapping holds a key twice."""

    def construct_document(self, node: yaml.Node) -> Any:
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


def load(text: str) -> Any:
    """The document in `text`; raises `DuplicateKey`, or yaml.YAMLError for bad syntax."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: plain data only
