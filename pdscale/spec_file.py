"""Reading a PDCluster YAML file for the command line, within limits.

A file is refused (``SpecFileError``, naming the document and where) before it can take the
command line down: more than MAX_BYTES, not UTF-8, a YAML syntax error, nesting deeper than
MAX_DEPTH, more than MAX_ALIASES aliases, a recursive alias, more than MAX_NODES values once
aliases are expanded, a duplicate key, an integer literal too long to be any field's value,
a date that does not exist, or a string that is not valid Unicode.

Aliases are allowed, within limits, rather than forbidden: an anchor with merge keys
(``<<: *role``) is a fair way to share settings between prefill and decode. An alias bomb is
stopped before anything is expanded: the document is composed first (nodes, with every alias
a reference to its anchor's one node, so memory stays proportional to the text), the number
of alias events is counted as they are composed, and the size the document would have once
expanded is computed on that graph, with a memo per node, before any Python value is built.
"""

from __future__ import annotations

import pathlib
import sys
from dataclasses import dataclass
from typing import Any, BinaryIO

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_ALIASES = 128
# Values (scalars and collections) in the file as written, and in one document with its
# aliases expanded; a PDCluster has a few hundred.
MAX_NODES = 100_000
# Digits in an integer literal: int64 has 19; this leaves room for the field's own message.
MAX_INT_DIGITS = 40

_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class SpecFileError(ValueError):
    """The file cannot be read as YAML documents; the message names the document."""


@dataclass(frozen=True)
class Document:
    number: int  # 1-based, counting every document in the stream (empty ones too)
    data: Any


def _where(node: Node | None) -> str:
    if node is None or node.start_mark is None:
        return ""
    return f" (line {node.start_mark.line + 1}, column {node.start_mark.column + 1})"


class _PyParser(Reader, Scanner, Parser):
    """PyYAML's own parser, where libyaml is missing."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)


try:  # libyaml's parser (events only: composing stays in Python, where the limits are)
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = _PyParser  # type: ignore[misc,assignment]


class _LimitedLoader(_Parser, Composer, SafeConstructor, Resolver):
    """A safe loader whose composer counts depth and aliases as it goes, and that reports a
    bad date or integer as a YAML error at its position instead of a bare ValueError. Events
    come from libyaml (five times faster than PyYAML's parser); nodes and values are built by
    PyYAML's composer and safe constructor."""

    check_node = Composer.check_node
    get_node = Composer.get_node

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self.depth = 0
        self.aliases = 0
        self.nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases", self._mark())
        self.nodes += 1
        if self.nodes > MAX_NODES:  # bounds the composed graph (and its memory) as well
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_NODES} values in the file", self._mark())
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", self._mark())
            return Composer.compose_node(self, parent, index)
        finally:
            self.depth -= 1

    def _mark(self) -> Any:
        return getattr(self.peek_event(), "start_mark", None)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits is out of range", node.start_mark)
        return int(SafeConstructor.construct_yaml_int(self, node))

    def construct_yaml_timestamp(self, node: ScalarNode) -> Any:
        try:
            return SafeConstructor.construct_yaml_timestamp(self, node)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"not a valid date or time: {exc}", node.start_mark) from None


_LimitedLoader.add_constructor(_INT_TAG, _LimitedLoader.construct_yaml_int)  # type: ignore[type-var]
_LimitedLoader.add_constructor("tag:yaml.org,2002:timestamp",  # type: ignore[type-var]
                               _LimitedLoader.construct_yaml_timestamp)


def _expanded_size(root: Node) -> int:
    """Nodes the document holds once every alias is expanded, without expanding it: a memo per
    node over the composed graph. A recursive alias (an anchor used inside itself) raises."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    # Iterative post-order walk: depth is bounded by MAX_DEPTH, but the walk needs no stack.
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            children = _children(node)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), MAX_NODES + 1)
            continue
        if key in sizes:
            continue
        if key in open_:
            raise SpecFileError(f"an alias refers to the collection it is in{_where(node)}")
        open_.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_:
                raise SpecFileError(f"an alias refers to the collection it is in{_where(child)}")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _duplicate_keys(root: Node) -> str | None:
    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, MappingNode):
            keys: set[tuple[str, str]] = set()
            for key, _ in node.value:
                if isinstance(key, ScalarNode) and key.tag != _MERGE_TAG:
                    ident = (key.tag, key.value)
                    if ident in keys:
                        return f"duplicate key {key.value!r}{_where(key)}"
                    keys.add(ident)
        stack.extend(_children(node))
    return None


def _invalid_unicode(value: Any, path: str) -> str | None:
    """The path of the first string (or key) holding a lone surrogate, which no UTF-8 output
    and no API server can carry."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where or "document"
        elif isinstance(item, dict):
            for k, v in item.items():
                stack.append((k, where))
                stack.append((v, f"{where}.{k}" if where else str(k)))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


def decode(raw: bytes) -> str:
    """The file's text: UTF-8 (a byte-order mark allowed), at most MAX_BYTES."""
    if len(raw) > MAX_BYTES:
        raise SpecFileError(f"document: the file is larger than {MAX_BYTES} bytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecFileError(f"document: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                            f"{exc.start})") from None


def parse(text: str) -> list[Document]:
    """Every document of a YAML stream, each checked against the limits before it is built."""
    docs = []
    number = 0
    try:
        loader = _LimitedLoader(text)  # the reader refuses control characters here
    except yaml.YAMLError as exc:
        raise SpecFileError(f"document 1: {_one_line(exc)}") from None
    try:
        while loader.check_node():
            number += 1
            node = loader.get_node()
            if node is None:
                docs.append(Document(number, None))
                continue
            _check_graph(node, number)
            data = loader.construct_document(node)
            bad = _invalid_unicode(data, "")
            if bad is not None:
                raise SpecFileError(f"document {number}: {bad}: not valid Unicode (a lone "
                                    f"surrogate escape)")
            docs.append(Document(number, data))
    except SpecFileError:
        raise
    except yaml.YAMLError as exc:
        raise SpecFileError(f"document {number or 1}: {_one_line(exc)}") from None
    except RecursionError:
        raise SpecFileError(f"document {number or 1}: nested too deeply") from None
    finally:
        dispose = getattr(loader, "dispose", None)
        if dispose is not None:
            dispose()
    return docs


def _check_graph(node: Node, number: int) -> None:
    try:
        size = _expanded_size(node)
    except SpecFileError as exc:
        raise SpecFileError(f"document {number}: {exc}") from None
    if size > MAX_NODES:
        raise SpecFileError(f"document {number}: more than {MAX_NODES} values once aliases "
                            f"are expanded (an alias bomb?)")
    dup = _duplicate_keys(node)
    if dup:
        raise SpecFileError(f"document {number}: {dup}")


def _one_line(exc: yaml.YAMLError) -> str:
    return " ".join(str(exc).replace('in "<unicode string>", ', "").split())


def read(filename: str, stdin: BinaryIO | None = None) -> list[Document]:
    """The documents of FILE ('-' for standard input); OSError if it cannot be read."""
    if filename == "-":
        raw = (stdin or sys.stdin.buffer).read(MAX_BYTES + 1)
    else:
        with pathlib.Path(filename).open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    return parse(decode(raw))


def load_bytes(raw: bytes) -> list[Document]:
    """Documents from bytes already in memory (the fuzz test and the bench use this)."""
    return parse(decode(raw))
