"""YAML for plans and workload files: PyYAML's safe loader, but a key given twice in one mapping is an error.

PyYAML keeps the last of two equal keys without a word, so a second ``sla:`` section (or a ``levels:`` written
twice under ``stages.ramp``) silently replaced the first. The YAML spec says keys are unique; this loader says
so too, naming the key's dotted path and both lines. Merge keys (``<<: *defaults``) may still be overridden.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MERGE_TAG = "tag:yaml.org,2002:merge"
YAMLError = yaml.YAMLError  # what load_yaml raises, DuplicateKeyError included


class DuplicateKeyError(ConstructorError):
    """A mapping holds a key twice: a ``yaml.YAMLError``, so callers that catch those call it bad YAML."""


#: libyaml's parser where PyYAML was built with it (about ten times faster than the pure-Python one)
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictSafeLoader(SafeLoader):
    """``yaml.SafeLoader`` refusing duplicate keys (checked on the node tree, before anything is built)."""

    def construct_document(self, node: Node) -> Any:
        self._check_unique(node, (), set())
        return super().construct_document(node)

    def _check_unique(self, node: Node, path: tuple[Any, ...], seen: set[int]) -> None:
        if id(node) in seen:  # an alias: checked where its anchor is (and no endless walk on a recursive one)
            return
        seen.add(id(node))
        if isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                self._check_unique(item, (*path, i), seen)
        elif isinstance(node, MappingNode):
            first: dict[Any, Node] = {}
            for key_node, value_node in node.value:
                if key_node.tag == MERGE_TAG or not isinstance(key_node, ScalarNode):
                    self._check_unique(value_node, path, seen)
                    continue
                key = self.construct_object(key_node)
                where = ".".join(str(p) for p in (*path, key))
                if key in first:
                    problem = f"duplicate key {where!r} (first at line {first[key].start_mark.line + 1})"
                    raise DuplicateKeyError("while constructing a mapping", node.start_mark, problem,
                                            key_node.start_mark)
                first[key] = key_node
                self._check_unique(value_node, (*path, key), seen)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` through libyaml's parser (files servetune writes itself: catalogs, profiles)."""
    return yaml.load(text, Loader=SafeLoader)  # noqa: S506 - SafeLoader or libyaml's CSafeLoader


def load_yaml(text: str) -> Any:
    """The document in ``text`` (like ``yaml.safe_load``); a duplicate key raises DuplicateKeyError."""
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
