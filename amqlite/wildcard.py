"""ActiveMQ destination wildcards: one implementation for subscriptions and authorization.

A STOMP destination is ``/queue/NAME`` or ``/topic/NAME``; the prefix says the kind and
is not part of the pattern. ``NAME`` is split on ``.`` into elements, and in a pattern
``*`` stands for exactly one element and ``>`` for the remaining elements, as in
ActiveMQ's ``DestinationFilter``: ``/topic/PRICE.STOCK.*`` matches ``PRICE.STOCK.IBM``,
``/topic/PRICE.>`` matches ``PRICE.STOCK`` and ``PRICE.STOCK.NASDAQ.IBM``.

Two choices differ from ActiveMQ Classic on purpose:

- ``>`` matches *one or more* elements, so ``/queue/a.>`` does not match ``/queue/a``.
  ActiveMQ also matches the parent (``PrefixDestinationFilter`` and
  ``DestinationMapNode``: "allow FOO.BAR to match the FOO.BAR.> entry"); amqlite's
  authorization rules have always said "a's children, not a" (tests/unit/test_authz.py),
  and a subscriber of ``a.>`` who also wants ``a`` subscribes to both.
- A pattern is refused unless ``*`` and ``>`` are whole elements, ``>`` is the last one
  and no element is empty. ActiveMQ takes ``a*`` or ``a.>.b`` as literal names without a
  word; here they are almost always a typo, and an ERROR says so.

A name is matched as it is: an element ``*`` in a destination name (not a pattern) is
just text. ``WildcardIndex`` answers "which patterns match this name" with a trie on the
elements, so the cost of a SEND to a topic grows with the name's length and the
matching patterns, not with the number of subscriptions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "ANY_CHILD",
    "ANY_DESCENDANT",
    "PREFIXES",
    "SEPARATOR",
    "Pattern",
    "WildcardError",
    "WildcardIndex",
    "compile_pattern",
    "is_wildcard",
    "split_destination",
]

#: Destination prefixes (STOMP names, see amqlite.validation.destination_kind); a
#: pattern only ever matches names of its own prefix.
PREFIXES = ("/queue/", "/topic/")
#: ActiveMQ's path separator (``DestinationFilter`` / ``DestinationPath``).
SEPARATOR = "."
#: ActiveMQ's ``DestinationFilter.ANY_CHILD``: exactly one element.
ANY_CHILD = "*"
#: ActiveMQ's ``DestinationFilter.ANY_DESCENDENT``: the remaining elements (one or more
#: here, see the module docstring).
ANY_DESCENDANT = ">"
_WILDCARDS = (ANY_CHILD, ANY_DESCENDANT)

Owner = TypeVar("Owner")


class WildcardError(ValueError):
    """A destination pattern that cannot be compiled; the message names it and why."""


def split_destination(destination: str) -> tuple[str, tuple[str, ...]] | None:
    """``/topic/a.b`` -> ``("/topic/", ("a", "b"))``; None for a name of neither kind."""
    for prefix in PREFIXES:
        if destination.startswith(prefix):
            return prefix, tuple(destination[len(prefix):].split(SEPARATOR))
    return None


def is_wildcard(name: str) -> bool:
    """Does ``name`` contain a wildcard element? The broker asks before treating a
    SUBSCRIBE as a pattern (or refusing a SEND to one). The ``/queue/``/``/topic/``
    prefix is not looked at; ``a*`` is not a wildcard (not a whole element)."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return any(element in _WILDCARDS for element in name.split(SEPARATOR))


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled destination pattern (``compile_pattern``); a name without wildcards
    is a pattern too, matching only itself."""

    text: str
    prefix: str
    elements: tuple[str, ...]

    @property
    def wildcard(self) -> bool:
        return any(element in _WILDCARDS for element in self.elements)

    def matches(self, destination: str) -> bool:
        """Does the destination name match? Only names of the same prefix can."""
        if not destination.startswith(self.prefix):
            return False
        parts = destination[len(self.prefix):].split(SEPARATOR)
        for i, element in enumerate(self.elements):
            if element == ANY_DESCENDANT:  # last (compile_pattern): one or more elements
                return i < len(parts)
            if i >= len(parts) or (element != ANY_CHILD and element != parts[i]):
                return False
        return len(parts) == len(self.elements)


def compile_pattern(destination: str) -> Pattern:
    """``/topic/PRICE.*.>`` -> its Pattern; WildcardError when it is not a usable
    pattern (no ``/queue/``/``/topic/`` prefix, an empty element, a wildcard that is
    not a whole element, ``>`` before the end)."""
    split = split_destination(destination)
    if split is None or split[1] == ("",):
        raise WildcardError(f"destination {destination!r} must be /queue/PATTERN or "
                            f"/topic/PATTERN")
    prefix, elements = split
    for i, element in enumerate(elements):
        if not element:
            raise WildcardError(f"destination {destination!r} has an empty segment")
        if element not in _WILDCARDS and (ANY_CHILD in element or ANY_DESCENDANT in element):
            raise WildcardError(f"destination {destination!r}: '*' and '>' must be whole "
                                f"segments")
        if element == ANY_DESCENDANT and i != len(elements) - 1:
            raise WildcardError(f"destination {destination!r}: '>' must be the last "
                                f"segment")
    return Pattern(destination, prefix, elements)


@dataclass(eq=False, slots=True)
class _Node(Generic[Owner]):
    """One element of the trie: what continues after it, and who ends here."""

    children: dict[str, _Node[Owner]] = field(default_factory=dict)  # literal and '*'
    owners: list[Owner] = field(default_factory=list)  # patterns that end here
    rest: list[Owner] = field(default_factory=list)  # patterns that go on with '>'

    def empty(self) -> bool:
        return not (self.children or self.owners or self.rest)


def _remove_identical(owners: list[Owner], owner: Owner) -> bool:
    for i, candidate in enumerate(owners):
        if candidate is owner:
            del owners[i]
            return True
    return False


class WildcardIndex(Generic[Owner]):
    """Patterns and their owners (a subscription, an authorization entry), indexed by
    element so that ``matching`` visits only trie nodes a name can reach: at most the
    literal and the ``*`` branch per element, whatever the number of other patterns.

    Owners are compared by identity (an owner need not be hashable); an owner added
    under several patterns that all match is returned once."""

    def __init__(self) -> None:
        self._roots: dict[str, _Node[Owner]] = {}
        self._count = 0

    def __len__(self) -> int:
        """Registrations (pattern, owner) held."""
        return self._count

    def add(self, pattern: Pattern | str, owner: Owner) -> Pattern:
        """Register ``owner`` under ``pattern`` (compiled if a string: WildcardError)."""
        compiled = pattern if isinstance(pattern, Pattern) else compile_pattern(pattern)
        node = self._roots.setdefault(compiled.prefix, _Node())
        *path, last = compiled.elements
        for element in path:
            node = node.children.setdefault(element, _Node())
        if last == ANY_DESCENDANT:
            node.rest.append(owner)
        else:
            node.children.setdefault(last, _Node()).owners.append(owner)
        self._count += 1
        return compiled

    def remove(self, pattern: Pattern | str, owner: Owner) -> bool:
        """Unregister one registration of ``owner`` under ``pattern``; False when there
        is none. Emptied trie nodes are dropped, so churning subscriptions leave nothing
        behind."""
        compiled = pattern if isinstance(pattern, Pattern) else compile_pattern(pattern)
        root = self._roots.get(compiled.prefix)
        if root is None:
            return False
        *path, last = compiled.elements
        trail: list[tuple[_Node[Owner], str]] = []  # (parent, element) down to the end
        node = root
        for element in path:
            child = node.children.get(element)
            if child is None:
                return False
            trail.append((node, element))
            node = child
        if last == ANY_DESCENDANT:
            removed = _remove_identical(node.rest, owner)
        else:
            end = node.children.get(last)
            if end is None:
                return False
            removed = _remove_identical(end.owners, owner)
            if removed and end.empty():
                del node.children[last]
        if not removed:
            return False
        self._count -= 1
        while trail and node.empty():
            parent, element = trail.pop()
            del parent.children[element]
            node = parent
        if root.empty():
            del self._roots[compiled.prefix]
        return True

    def matching(self, destination: str) -> list[Owner]:
        """Owners of every pattern that matches the destination name, each once."""
        split = split_destination(destination)
        root = None if split is None else self._roots.get(split[0])
        if split is None or root is None:
            return []
        elements = split[1]
        found: dict[int, Owner] = {}
        for owner in self._walk(root, elements):
            found.setdefault(id(owner), owner)
        return list(found.values())

    @staticmethod
    def _walk(root: _Node[Owner], elements: tuple[str, ...]) -> Iterator[Owner]:
        size = len(elements)
        stack = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i == size:
                yield from node.owners
                continue
            yield from node.rest  # '>' takes elements[i:], at least one
            child = node.children.get(elements[i])
            if child is not None:
                stack.append((child, i + 1))
            star = node.children.get(ANY_CHILD)
            if star is not None and star is not child:
                stack.append((star, i + 1))
