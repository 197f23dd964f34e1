"""ActiveMQ destination wildcards (amqlite.wildcard), without a broker."""

from __future__ import annotations

import random

import pytest

from amqlite import wildcard
from amqlite.wildcard import (
    Pattern,
    WildcardError,
    WildcardIndex,
    compile_pattern,
    is_wildcard,
)


@pytest.mark.parametrize("pattern, name, ok", [
    # ActiveMQ's wildcards page: PRICE.STOCK.NASDAQ.ORCL and PRICE.STOCK.NYSE.IBM
    ("/topic/PRICE.>", "/topic/PRICE.STOCK.NASDAQ.ORCL", True),
    ("/topic/PRICE.>", "/topic/PRICE.STOCK", True),
    ("/topic/PRICE.STOCK.>", "/topic/PRICE.STOCK.NYSE.IBM", True),
    ("/topic/PRICE.STOCK.NASDAQ.*", "/topic/PRICE.STOCK.NASDAQ.ORCL", True),
    ("/topic/PRICE.STOCK.NASDAQ.*", "/topic/PRICE.STOCK.NYSE.IBM", False),
    ("/topic/PRICE.STOCK.*.IBM", "/topic/PRICE.STOCK.NYSE.IBM", True),
    ("/topic/PRICE.STOCK.*.IBM", "/topic/PRICE.STOCK.NASDAQ.ORCL", False),
    # '>' is one or more elements here (ActiveMQ also matches the parent: see wildcard.py)
    ("/topic/PRICE.>", "/topic/PRICE", False),
    ("/topic/>", "/topic/PRICE", True),
    # ActiveMQ's DestinationFilterTest.testMatchesChild
    ("/queue/A.*.C", "/queue/A.B.C", True),
    ("/queue/A.*.C", "/queue/A.B", False),
    ("/queue/A.*", "/queue/A.B", True),
    ("/queue/A.*", "/queue/A", False),
    ("/queue/A.*", "/queue/A.B.C", False),
    ("/queue/*.*", "/queue/A.B", True),
    # literal names match themselves only
    ("/queue/orders", "/queue/orders", True),
    ("/queue/orders", "/queue/orders.eu", False),
    ("/queue/orders", "/queue/order", False),
    # an element '*' in a name is text; a longer element is not a wildcard element
    ("/queue/a.b", "/queue/a.*", False),
    ("/queue/a.*", "/queue/a.*", True),
    ("/queue/a.b", "/queue/a.bc", False),
])
def test_matches(pattern: str, name: str, ok: bool) -> None:
    assert compile_pattern(pattern).matches(name) is ok
    index: WildcardIndex[str] = WildcardIndex()
    index.add(pattern, "owner")
    assert index.matching(name) == (["owner"] if ok else [])


@pytest.mark.parametrize("pattern, name", [
    ("/topic/>", "/queue/x"),          # DestinationFilterTest.testPrefixFilter
    ("/queue/A.*", "/topic/A.B"),      # DestinationFilterTest.testWildcardFilter
    ("/queue/A.B", "/topic/A.B"),
    ("/queue/>", "/temp-queue/x"),
    ("/queue/>", "queue/x"),
])
def test_a_pattern_matches_only_its_own_kind(pattern: str, name: str) -> None:
    assert not compile_pattern(pattern).matches(name)
    index: WildcardIndex[str] = WildcardIndex()
    index.add(pattern, "owner")
    assert index.matching(name) == []


@pytest.mark.parametrize("name, expected", [
    ("/topic/PRICE.STOCK.>", True),
    ("/topic/PRICE.*.IBM", True),
    ("/queue/>", True),
    ("/queue/*", True),
    ("/topic/PRICE.STOCK", False),
    ("/topic/PRICE*", False),           # not a whole element: a plain name
    ("/topic/a>b.c", False),
    ("/queue/", False),
    ("PRICE.>", True),                  # no prefix: the whole name is the pattern
    ("/topic/>x", False),
])
def test_is_wildcard(name: str, expected: bool) -> None:
    assert is_wildcard(name) is expected


@pytest.mark.parametrize("pattern, words", [
    ("/queue/", "/queue/PATTERN"),
    ("orders.>", "/queue/PATTERN"),
    ("/temp-topic/x", "/queue/PATTERN"),
    ("/queue/a..b", "empty segment"),
    ("/queue/a.", "empty segment"),
    ("/queue/.a", "empty segment"),
    ("/queue/a*", "whole segments"),
    ("/queue/a.b>", "whole segments"),
    ("/queue/>.a", "last segment"),
    ("/queue/a.>.>", "last segment"),
])
def test_malformed_patterns_are_refused_with_why(pattern: str, words: str) -> None:
    with pytest.raises(WildcardError, match=words) as e:
        compile_pattern(pattern)
    assert repr(pattern) in str(e.value)
    assert isinstance(e.value, ValueError)


def test_compiled_pattern() -> None:
    p = compile_pattern("/topic/PRICE.*.>")
    assert p == Pattern("/topic/PRICE.*.>", "/topic/", ("PRICE", "*", ">"))
    assert p.wildcard and not compile_pattern("/topic/PRICE").wildcard
    assert hash(p) == hash(compile_pattern("/topic/PRICE.*.>"))


def test_index_returns_every_matching_owner_once() -> None:
    index: WildcardIndex[str] = WildcardIndex()
    for pattern, owner in [("/topic/a.>", "deep"), ("/topic/a.*", "child"),
                           ("/topic/a.b", "exact"), ("/topic/*.b", "any-b"),
                           ("/topic/>", "all"), ("/topic/a.*", "child2"),
                           ("/topic/a.b.c", "other"), ("/queue/a.b", "queue")]:
        index.add(pattern, owner)
    assert sorted(index.matching("/topic/a.b")) == sorted(
        ["deep", "child", "exact", "any-b", "all", "child2"])
    assert sorted(index.matching("/topic/a.b.c")) == ["all", "deep", "other"]
    assert index.matching("/topic/a") == ["all"]
    assert index.matching("/queue/a.b") == ["queue"]
    assert index.matching("/nowhere/a.b") == []
    # one owner under several matching patterns comes back once
    index.add("/topic/a.b", "deep")
    assert index.matching("/topic/a.b").count("deep") == 1


def test_owners_are_compared_by_identity() -> None:
    """An owner need not be hashable, and two equal owners are two owners."""
    first: dict[str, int] = {"n": 1}
    second: dict[str, int] = {"n": 1}
    index: WildcardIndex[dict[str, int]] = WildcardIndex()
    index.add("/topic/x.*", first)
    index.add("/topic/x.*", second)
    found = index.matching("/topic/x.y")
    assert len(found) == 2 and found[0] is not found[1]
    assert index.remove("/topic/x.*", second)
    assert [o is first for o in index.matching("/topic/x.y")] == [True]


def test_remove_prunes_the_trie() -> None:
    index: WildcardIndex[str] = WildcardIndex()
    patterns = ["/topic/a.b.c", "/topic/a.*.>", "/topic/a.>", "/topic/>", "/queue/q"]
    for p in patterns:
        index.add(p, p)
    index.add("/topic/a.b.c", "twice")
    assert len(index) == 6
    assert not index.remove("/topic/a.b.c", "nobody")
    assert not index.remove("/topic/a.b", "/topic/a.b.c")  # a prefix of a pattern
    assert not index.remove("/topic/z.>", "/topic/>")
    assert index.remove("/topic/a.b.c", "twice")
    assert index.matching("/topic/a.b.c") != [] and len(index) == 5
    for p in patterns:
        assert index.remove(compile_pattern(p), p)
        assert not index.remove(p, p)
    assert len(index) == 0
    assert index._roots == {}  # nothing left behind by churning subscriptions


def test_matching_never_walks_a_branch_the_name_cannot_reach() -> None:
    """Non-matching patterns cost nothing: SEND to a topic runs this every time."""

    class Untouchable(dict[str, object]):
        def get(self, *args: object) -> object:
            raise AssertionError("walked a branch the name cannot match")

    index: WildcardIndex[int] = WildcardIndex()
    for i in range(2000):
        index.add(f"/topic/noise.{i}.*", i)
        index.add(f"/topic/PRICE.OTHER{i}.>", -i - 1)
    index.add("/topic/PRICE.STOCK.*", 10**6)
    root = index._roots["/topic/"]
    noise = root.children["noise"]
    noise.children = Untouchable(noise.children)  # type: ignore[assignment]
    assert index.matching("/topic/PRICE.STOCK.IBM") == [10**6]


def test_index_agrees_with_pattern_matches() -> None:
    """The trie and Pattern.matches are two walks over one rule: they must agree."""
    rng = random.Random(21)
    alphabet = ["a", "b", "c"]

    def random_pattern() -> str:
        n = rng.randint(1, 4)
        elements = [rng.choice([*alphabet, "*", "*"]) for _ in range(n)]
        if rng.random() < 0.3:
            elements[-1] = ">"
        return rng.choice(wildcard.PREFIXES) + ".".join(elements)

    def random_name() -> str:
        n = rng.randint(1, 5)
        return rng.choice(wildcard.PREFIXES) + ".".join(rng.choice(alphabet)
                                                        for _ in range(n))

    patterns = [compile_pattern(random_pattern()) for _ in range(300)]
    index: WildcardIndex[Pattern] = WildcardIndex()
    for p in patterns:
        index.add(p, p)
    for _ in range(500):
        name = random_name()
        expected = {id(p) for p in patterns if p.matches(name)}
        assert {id(p) for p in index.matching(name)} == expected, name
