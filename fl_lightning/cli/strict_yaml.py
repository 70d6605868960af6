"""The command line's YAML: jsonargparse's own loader, after a check that refuses what PyYAML accepts silently.

PyYAML keeps the last of two equal keys, so a configuration with ``trainer:`` twice silently replaces the whole
first section; and aliases may nest into a "billion laughs" document whose expansion never finishes. The check
composes the document (aliases stay shared nodes, so this is quick) and refuses both with one error naming the
key and its lines, or the expanded size. Registered as the parser mode :data:`MODE`, which
:class:`~fl_lightning.cli.FederatedCLI` uses.
"""

from __future__ import annotations

from typing import Any

import yaml
from jsonargparse import get_loader, set_loader

#: The parser mode whose loader runs :func:`check_yaml` first.
MODE = "fl_yaml"
#: The most nodes a document may hold once its aliases are expanded (a configuration holds hundreds).
MAX_EXPANDED_NODES = 100_000


def check_yaml(text: str) -> None:
    """Raises ``yaml.YAMLError`` for a mapping with a key given twice (naming it and both lines) or a document
    whose aliases expand to more than :data:`MAX_EXPANDED_NODES` nodes (or refer to themselves)."""
    for node in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if node is not None:
            _expanded_size(node, {}, set())


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """Nodes under ``node`` with every alias expanded, memoised per node (``sizes``); checks each mapping's keys."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise yaml.YAMLError(f"an alias at line {node.start_mark.line + 1} refers to a node that contains it.")
    open_nodes.add(id(node))
    size = 1
    if isinstance(node, yaml.MappingNode):
        _check_keys(node)
        size += sum(_expanded_size(key, sizes, open_nodes) + _expanded_size(value, sizes, open_nodes) for key, value in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, sizes, open_nodes) for item in node.value)
    open_nodes.discard(id(node))
    if size > MAX_EXPANDED_NODES:
        raise yaml.YAMLError(
            f"the YAML document's aliases expand to more than {MAX_EXPANDED_NODES} nodes (at line "
            f"{node.start_mark.line + 1}): write the values out instead of nesting aliases."
        )
    sizes[id(node)] = size
    return size


def _check_keys(node: yaml.MappingNode) -> None:
    first: dict[Any, int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        line = key.start_mark.line + 1
        if key.value in first:
            raise yaml.YAMLError(
                f"duplicate key {key.value!r} at line {line} (first at line {first[key.value]}): YAML would keep only "
                "the last one; merge the two into one."
            )
        first[key.value] = line


def _load(text: str) -> Any:
    check_yaml(text)
    return _yaml_load(text)


_yaml_load = get_loader("yaml")
set_loader(MODE, _load, exceptions=(yaml.YAMLError,))
