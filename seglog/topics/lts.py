"""Learned topic structure (LTS): a trie that groups similar MQTT topics into streams.

A port of EMQX Durable Storage's ``emqx_ds_lts``. Each topic is split level by level into
*static* levels (part of the stream's identity) and *varying* levels (stored with each
message). A trie node that has seen ``threshold`` distinct static children grows a ``+``
edge, and every later unseen token at that node goes through it, so
``metrics/host1/cpu``, ``metrics/host2/cpu``, ... end up in one stream ``metrics/+/cpu``
once enough hosts have been seen.

The learning rules are EMQX's:

* topics whose first level starts with ``$`` live under a separate root, so a filter whose
  first level is a wildcard never reaches them [MQTT-4.7.2-1];
* the exact edge is tried before ``+``, so a topic learned before its parent node became
  wildcard keeps its stream (EMQX calls this "crucial": otherwise one topic's messages
  would be split across two streams and lose their replay order);
* a missing edge becomes a static edge while the node has fewer than
  ``threshold(depth)`` static children; the static edge that brings the count to the
  threshold also inserts the node's ``+`` edge; a node whose threshold is 0 (or was
  already reached under other thresholds) gets a ``+`` edge directly;
* nothing is rewritten retroactively.

``threshold(depth)`` is ``thresholds[min(depth, len(thresholds) - 1)]`` (EMQX's
``{simple, Tuple}`` spec), with depth 0 the first level in both roots.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_LTS_THRESHOLDS",
    "LTS",
    "structure_regex",
    "varying_filter_for",
    "varying_matches",
]

import struct
import zlib
from collections.abc import Iterable, Sequence

from seglog.errors import CorruptLTS, InvalidArgument, InvalidTopic
from seglog.topics.filters import MAX_TOPIC_BYTES, validate_topic_filter

DEFAULT_LTS_THRESHOLDS: tuple[int, ...] = (100, 10)
"""EMQX's default ``wildcard_thresholds``: 100 distinct first levels, 10 deeper."""

_SEP = "/"
_PLUS = "+"
_MULTI = "#"
_NONE = -1  # "no such edge" in the int-valued node arrays
_PREFIX_ROOT = 0
_SPECIAL_ROOT = 1  # topics whose first level starts with '$'
_N_ROOTS = 2
_MAX_U32 = 0xFFFFFFFF
_DEFAULT_CACHE_SIZE = 1 << 16

_MAGIC = b"SLTS"
_VERSION = 1
_HEADER = struct.Struct("<4sBI")  # magic, version, CRC-32 of magic + version + body
_U32 = struct.Struct("<I")
_EDGE_STATIC = 0
_EDGE_PLUS = 1


def varying_matches(varying_filter: Sequence[str | None], varying: Sequence[str]) -> bool:
    """Returns whether a topic's varying levels satisfy a varying filter from :meth:`LTS.match`.

    Args:
        varying_filter: Per varying level, the required token, or ``None`` for any.
        varying: The topic's varying levels, as returned by :meth:`LTS.learn`.
    """
    if len(varying_filter) != len(varying):
        return False
    return all(want is None or want == got for want, got in zip(varying_filter, varying, strict=True))


def varying_filter_for(structure: Sequence[str], special: bool, topic_filter: str) -> list[str | None] | None:
    """The varying filter of ``topic_filter`` for a stream of this learned structure.

    Args:
        structure: The stream's levels, ``+`` where they vary (:meth:`LTS.structure`).
        special: Whether the stream lives under the ``$`` root (:meth:`LTS.is_special`).
        topic_filter: An MQTT topic filter.

    Returns:
        Per varying level, the token the filter requires there or ``None`` for any (what
        :meth:`LTS.match` gives for the stream); ``None`` when the filter can match no topic
        of the stream (EMQX's ``compress_topic`` mismatch).

    Raises:
        InvalidTopicFilter: If ``topic_filter`` is malformed.
    """
    validate_topic_filter(topic_filter)
    levels = topic_filter.split(_SEP)
    # '$' topics only match filters that name their first level ('+'/'#' never start with '$').
    if levels[0].startswith("$") != special:
        return None
    vf: list[str | None] = []
    for i, have in enumerate(structure):
        if i >= len(levels):
            return None
        want = levels[i]
        if want == _MULTI:
            vf.extend(None for tok in structure[i:] if tok == _PLUS)
            return vf
        if have == _PLUS:
            vf.append(None if want == _PLUS else want)
        elif want != _PLUS and want != have:
            return None
    if len(levels) == len(structure):
        return vf
    if len(levels) == len(structure) + 1 and levels[-1] == _MULTI:
        return vf  # '#' matches the parent level too
    return None


_REGEX_META = frozenset("\\.+*?()|[]{}^$")


def structure_regex(structure: Sequence[str], varying_filter: Sequence[str | None]) -> str | None:
    """An anchored regex (RE2 and Python ``re``) for the topics of a stream that satisfy a
    varying filter; ``None`` when the filter constrains nothing (every topic of the stream).

    Only meaningful for topics of that stream: its static levels are matched literally and
    the ``$`` rule is not applied (the stream's root already decided it).
    """
    if all(v is None for v in varying_filter):
        return None
    parts: list[str] = []
    it = iter(varying_filter)
    for tok in structure:
        want = next(it) if tok == _PLUS else tok
        parts.append("[^/]*" if want is None else "".join("\\" + c if c in _REGEX_META else c for c in want))
    return "(?s)^" + "/".join(parts) + "$"


def _check_thresholds(thresholds: Iterable[int]) -> tuple[int, ...]:
    result = tuple(thresholds)
    if not result:
        raise InvalidArgument("LTS thresholds must not be empty")
    for thr in result:
        # bool is an int subclass but True/False as a threshold is certainly a mistake.
        if not isinstance(thr, int) or isinstance(thr, bool) or not 0 <= thr <= _MAX_U32:
            raise InvalidArgument(f"LTS thresholds must be ints in [0, 2**32 - 1], got {thr!r}")
    return result


def _split_topic(topic: str) -> list[str]:
    if not isinstance(topic, str):
        raise InvalidTopic(f"topic must be str, not {type(topic).__name__}")
    if not topic:
        raise InvalidTopic("topic must not be empty")
    if "+" in topic or "#" in topic or "\x00" in topic:
        raise InvalidTopic("topic name must not contain '+', '#' or U+0000 (wildcards belong in filters)")
    try:
        encoded_bytes = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidTopic("topic is not valid UTF-8 (lone surrogate)") from None
    if encoded_bytes > MAX_TOPIC_BYTES:
        raise InvalidTopic(f"topic is longer than {MAX_TOPIC_BYTES} UTF-8 bytes")
    return topic.split(_SEP)


class LTS:
    """A learned topic structure trie mapping topics to ``(stream id, varying levels)``.

    Stream ids are dense non-negative ints in order of creation, so they fit a uint32
    column. Not thread-safe: one writer (or external locking) per trie.

    Args:
        thresholds: Static children a node may have at each depth before it grows a
            ``+`` edge; the last element applies to all deeper levels. Use
            ``2**32 - 1`` for "never" and 0 for "always varying".
        cache_size: Most distinct topics remembered by the exact topic -> stream cache
            used by :meth:`learn` and :meth:`learn_many`; the cache is emptied when full,
            which only costs speed.
    """

    __slots__ = (
        "_cache",
        "_cache_size",
        "_eot",
        "_parent",
        "_plus",
        "_plus_positions",
        "_static",
        "_stream_node",
        "_thresholds",
        "_token",
    )

    def __init__(
        self, thresholds: Sequence[int] = DEFAULT_LTS_THRESHOLDS, *, cache_size: int = _DEFAULT_CACHE_SIZE
    ) -> None:
        self._thresholds = _check_thresholds(thresholds)
        if not isinstance(cache_size, int) or cache_size < 0:
            raise InvalidArgument(f"cache_size must be a non-negative int, got {cache_size!r}")
        self._cache_size = cache_size
        # Nodes are parallel arrays indexed by node id; ids are dense and a child's id is
        # always larger than its parent's, which keeps serialization a simple replay.
        self._static: list[dict[str, int]] = []
        self._plus: list[int] = []
        self._eot: list[int] = []  # stream id of the topic ending at this node, or -1
        self._parent: list[int] = []
        self._token: list[str | None] = []  # edge label from the parent; None for '+'
        self._stream_node: list[int] = []  # stream id -> node where its topics end
        self._plus_positions: list[tuple[int, ...]] = []  # stream id -> varying level indices
        self._cache: dict[str, int] = {}
        for _ in range(_N_ROOTS):
            self._new_node(_NONE, None)

    # --- introspection ------------------------------------------------------------------

    @property
    def thresholds(self) -> tuple[int, ...]:
        """The per-depth thresholds this trie learns with."""
        return self._thresholds

    @property
    def stream_count(self) -> int:
        """Number of streams; stream ids are ``range(stream_count)``."""
        return len(self._stream_node)

    @property
    def node_count(self) -> int:
        """Number of trie nodes, including the two roots."""
        return len(self._parent)

    def __len__(self) -> int:
        return len(self._stream_node)

    def __repr__(self) -> str:
        return (
            f"LTS(thresholds={list(self._thresholds)}, streams={self.stream_count}, nodes={self.node_count})"
        )

    def threshold(self, depth: int) -> int:
        """Returns the static-children threshold for a node at ``depth`` (0 = first level)."""
        return self._thresholds[min(depth, len(self._thresholds) - 1)]

    def structure(self, stream: int) -> tuple[str, ...]:
        """Returns a stream's learned structure, ``+`` at varying levels (EMQX reverse_lookup).

        A ``+`` first level does not say which root the stream lives under; topics
        starting with ``$`` never share a stream with other topics.

        Raises:
            InvalidArgument: If ``stream`` is not a stream id of this trie.
        """
        if not isinstance(stream, int) or not 0 <= stream < len(self._stream_node):
            raise InvalidArgument(f"no stream {stream!r} in this LTS ({len(self._stream_node)} streams)")
        return self._path(self._stream_node[stream])

    def wildcard_edges(self) -> list[tuple[str, ...]]:
        """Returns the path to every node that has a ``+`` edge, ``+`` for varying levels.

        This shows what the trie has learned, including ``+`` edges no topic went
        through yet.
        """
        result: list[tuple[str, ...]] = []
        for node, plus in enumerate(self._plus):
            if plus != _NONE:
                result.append(self._path(node))
        return result

    # --- topic -> key ---------------------------------------------------------------------

    def lookup(self, topic: str) -> tuple[int, list[str]] | None:
        """Returns ``(stream, varying)`` for a topic without learning anything.

        Returns:
            ``None`` if the trie would have to grow to place ``topic``.

        Raises:
            InvalidTopic: If ``topic`` is not a valid topic name.
        """
        levels = _split_topic(topic)
        stream = self._cache.get(topic)
        if stream is not None:
            return stream, [levels[i] for i in self._plus_positions[stream]]
        node = _SPECIAL_ROOT if levels[0].startswith("$") else _PREFIX_ROOT
        varying: list[str] = []
        static, plus = self._static, self._plus
        for tok in levels:
            child = static[node].get(tok)
            if child is None:
                child = plus[node]
                if child == _NONE:
                    return None
                varying.append(tok)
            node = child
        stream = self._eot[node]
        return None if stream == _NONE else (stream, varying)

    def learn(self, topic: str) -> tuple[int, list[str]]:
        """Returns ``(stream, varying)`` for a topic, growing the trie if needed.

        Raises:
            InvalidTopic: If ``topic`` is not a valid topic name.
        """
        levels = _split_topic(topic)
        stream = self._cache.get(topic)
        if stream is None:
            stream = self._learn_levels(levels)
            self._remember(topic, stream)
        return stream, [levels[i] for i in self._plus_positions[stream]]

    def learn_many(self, topics: Sequence[str]) -> list[int]:
        """Returns the stream id of each topic, learning as needed.

        A topic seen before costs one dict lookup, so this is cheap per record when
        topics repeat. Varying levels are ``[topic.split("/")[i] for i in
        varying_positions(stream)]``.

        Raises:
            InvalidTopic: If a topic is invalid; ``index`` names the first bad one. Topics
                before it have been learned.
        """
        cache = self._cache
        out: list[int] = []
        append = out.append
        for i, topic in enumerate(topics):
            stream = cache.get(topic)
            if stream is None:
                try:
                    levels = _split_topic(topic)
                except InvalidTopic as exc:
                    raise InvalidTopic(str(exc), index=i) from None
                stream = self._learn_levels(levels)
                self._remember(topic, stream)
            append(stream)
        return out

    def learn_stream(self, topic: str) -> int:
        """Returns the stream id of one topic, learning as needed (no varying levels built).

        Raises:
            InvalidTopic: If ``topic`` is not a valid topic name.
        """
        stream = self._cache.get(topic)
        if stream is None:
            stream = self._learn_levels(_split_topic(topic))
            self._remember(topic, stream)
        return stream

    def learn_valid(self, topics: Sequence[str]) -> tuple[list[int], list[int], list[int]]:
        """Learns topics already validated as names (:func:`seglog.record` checks appends).

        The lean loop of an append's cache misses: no validation, no cache.

        Returns:
            ``(streams, node counts, stream counts)``: each topic's stream id, and how many
            nodes and streams the trie has right after learning it (callers that track
            which topic created which node compare them).
        """
        streams: list[int] = []
        nodes_after: list[int] = []
        streams_after: list[int] = []
        learn = self._learn_levels
        parents, ends = self._parent, self._stream_node
        for topic in topics:
            streams.append(learn(topic.split(_SEP)))
            nodes_after.append(len(parents))
            streams_after.append(len(ends))
        return streams, nodes_after, streams_after

    def varying_positions(self, stream: int) -> tuple[int, ...]:
        """Returns the level indices that vary in ``stream`` (its ``+`` positions).

        Raises:
            InvalidArgument: If ``stream`` is not a stream id of this trie.
        """
        if not isinstance(stream, int) or not 0 <= stream < len(self._plus_positions):
            raise InvalidArgument(f"no stream {stream!r} in this LTS ({len(self._plus_positions)} streams)")
        return self._plus_positions[stream]

    def _remember(self, topic: str, stream: int) -> None:
        if self._cache_size == 0:
            return
        if len(self._cache) >= self._cache_size:
            # Clearing beats LRU bookkeeping on the hot path; misses just walk the trie.
            self._cache.clear()
        self._cache[topic] = stream

    def _learn_levels(self, levels: list[str]) -> int:
        node = _SPECIAL_ROOT if levels[0].startswith("$") else _PREFIX_ROOT
        static, plus = self._static, self._plus
        for depth, tok in enumerate(levels):
            child = static[node].get(tok)
            if child is not None:  # exact edge first: learned topics keep their stream
                node = child
                continue
            child = plus[node]
            if child != _NONE:
                node = child
                continue
            thr = self.threshold(depth)
            children = static[node]
            if len(children) < thr:
                child = self._new_node(node, tok)
                children[tok] = child
                if len(children) >= thr:
                    # EMQX inserts '+' as soon as the threshold is reached, so the next
                    # unseen token already finds it; this token itself stays static.
                    plus[node] = self._new_node(node, None)
            else:
                # Threshold 0, or reached under other thresholds (an inherited trie):
                # the level varies from the first topic on.
                child = self._new_node(node, None)
                plus[node] = child
            node = child
        stream = self._eot[node]
        if stream == _NONE:
            stream = self._add_stream(node)
        return stream

    def _new_node(self, parent: int, token: str | None) -> int:
        node = len(self._parent)
        self._static.append({})
        self._plus.append(_NONE)
        self._eot.append(_NONE)
        self._parent.append(parent)
        self._token.append(token)
        return node

    def _add_stream(self, node: int) -> int:
        stream = len(self._stream_node)
        self._eot[node] = stream
        self._stream_node.append(node)
        path = self._path(node)
        self._plus_positions.append(tuple(i for i, tok in enumerate(path) if tok == _PLUS))
        return stream

    def _path(self, node: int) -> tuple[str, ...]:
        tokens: list[str] = []
        while node >= _N_ROOTS:
            token = self._token[node]
            tokens.append(_PLUS if token is None else token)
            node = self._parent[node]
        tokens.reverse()
        return tuple(tokens)

    def is_special(self, stream: int) -> bool:
        """Whether ``stream`` lives under the ``$`` root (its topics start with ``$``).

        Raises:
            InvalidArgument: If ``stream`` is not a stream id of this trie.
        """
        if not isinstance(stream, int) or not 0 <= stream < len(self._stream_node):
            raise InvalidArgument(f"no stream {stream!r} in this LTS ({len(self._stream_node)} streams)")
        node = self._stream_node[stream]
        while self._parent[node] >= _N_ROOTS:
            node = self._parent[node]
        return self._parent[node] == _SPECIAL_ROOT

    def truncate(self, node_count: int, stream_count: int) -> None:
        """Forgets every node with an id ``>= node_count`` and every stream ``>= stream_count``.

        The trie becomes what it was when it had that many nodes and streams (node and
        stream ids only grow, and a child's id is larger than its parent's), so this undoes
        the learning of a suffix of topics, e.g. of records whose write was rolled back. The
        caller names counts the trie really had at some point (a stream's end node must not
        be cut while the stream is kept).

        Raises:
            InvalidArgument: If a count is out of range or a kept stream ends at a cut node.
        """
        n_nodes, n_streams = len(self._parent), len(self._stream_node)
        if not _N_ROOTS <= node_count <= n_nodes or not 0 <= stream_count <= n_streams:
            raise InvalidArgument(
                f"cannot truncate an LTS of {n_nodes} nodes and {n_streams} streams "
                f"to {node_count} nodes and {stream_count} streams"
            )
        if any(node >= node_count for node in self._stream_node[:stream_count]):
            raise InvalidArgument("a kept stream ends at a node that would be cut")
        for stream in range(stream_count, n_streams):
            self._eot[self._stream_node[stream]] = _NONE
        del self._stream_node[stream_count:]
        del self._plus_positions[stream_count:]
        for node in range(n_nodes - 1, node_count - 1, -1):
            parent = self._parent[node]
            token = self._token[node]
            if token is None:
                self._plus[parent] = _NONE
            else:
                del self._static[parent][token]
        for column in (self._static, self._plus, self._eot, self._parent, self._token):
            del column[node_count:]
        if stream_count < n_streams or node_count < n_nodes:
            self._cache.clear()

    # --- filter -> streams ------------------------------------------------------------------

    def match(self, topic_filter: str) -> list[tuple[int, list[str | None]]]:
        """Returns every stream that may hold topics matching an MQTT filter.

        Each stream comes with its *varying filter*: for each varying level of the
        stream, the token the filter requires there, or ``None`` for any. A topic of
        the stream matches the filter exactly when its varying levels satisfy the
        varying filter (see :func:`varying_matches`). Streams are in id order.

        Raises:
            InvalidTopicFilter: If ``topic_filter`` is malformed.
        """
        validate_topic_filter(topic_filter)
        levels = topic_filter.split(_SEP)
        n_levels = len(levels)
        # Only an explicit '$...' first level reaches the '$' root [MQTT-4.7.2-1]; a
        # normal-root topic never starts with '$', so such a filter needs nothing else.
        root = _SPECIAL_ROOT if levels[0].startswith("$") else _PREFIX_ROOT
        static, plus, eot = self._static, self._plus, self._eot
        out: list[tuple[int, list[str | None]]] = []
        # An explicit stack instead of recursion: topics may have thousands of levels.
        stack: list[tuple[int, int, tuple[str | None, ...]]] = [(root, 0, ())]
        while stack:
            node, i, vf = stack.pop()
            if i == n_levels:
                if eot[node] != _NONE:
                    out.append((eot[node], list(vf)))
                continue
            level = levels[i]
            if level == _MULTI:
                self._collect_subtree(node, vf, out)
                continue
            if level == _PLUS:
                stack.extend((child, i + 1, vf) for child in static[node].values())
                if plus[node] != _NONE:
                    stack.append((plus[node], i + 1, (*vf, None)))
            else:
                child = static[node].get(level)
                if child is not None:
                    stack.append((child, i + 1, vf))
                if plus[node] != _NONE:
                    stack.append((plus[node], i + 1, (*vf, level)))
        out.sort(key=lambda item: item[0])
        return out

    def varying_filter(self, stream: int, topic_filter: str) -> list[str | None] | None:
        """Returns the varying filter of ``topic_filter`` for one stream (EMQX compress_topic).

        The same answer :meth:`match` gives for that stream: per varying level, the token
        the filter requires there or ``None`` for any; ``None`` when the filter can match
        no topic of the stream.

        Raises:
            InvalidArgument: If ``stream`` is not a stream id of this trie.
            InvalidTopicFilter: If ``topic_filter`` is malformed.
        """
        return varying_filter_for(self.structure(stream), self.is_special(stream), topic_filter)

    def _collect_subtree(
        self, start: int, vf: tuple[str | None, ...], out: list[tuple[int, list[str | None]]]
    ) -> None:
        # '#' matches the parent too, hence the start node's own end-of-topic counts.
        static, plus, eot = self._static, self._plus, self._eot
        stack = [(start, vf)]
        while stack:
            node, cur = stack.pop()
            if eot[node] != _NONE:
                out.append((eot[node], list(cur)))
            stack.extend((child, cur) for child in static[node].values())
            if plus[node] != _NONE:
                stack.append((plus[node], (*cur, None)))

    # --- generations and persistence --------------------------------------------------

    def inherit_wildcards(self, thresholds: Sequence[int] | None = None) -> LTS:
        """Returns a fresh trie for a new generation holding only the learned wildcards.

        Like EMQX's ``trie_copy_learned_paths`` (``trie_dump(Old, wildcard)``), only
        complete topic paths containing at least one ``+`` are copied, with their static
        edges and end of topic; purely static paths and ``+`` edges that no topic went
        through yet are dropped. Unlike EMQX, paths under the ``$`` root are copied too.
        Copied streams get new dense ids in the order of their old ids.

        Args:
            thresholds: Thresholds of the new trie; default: this trie's.
        """
        new = LTS(self._thresholds if thresholds is None else thresholds, cache_size=self._cache_size)
        for node in self._stream_node:
            chain: list[int] = []
            cur = node
            while cur >= _N_ROOTS:
                chain.append(cur)
                cur = self._parent[cur]
            if all(self._token[n] is not None for n in chain):
                continue
            target = cur  # the root this stream lives under
            for n in reversed(chain):
                token = self._token[n]
                if token is None:
                    nxt = new._plus[target]
                    if nxt == _NONE:
                        nxt = new._new_node(target, None)
                        new._plus[target] = nxt
                else:
                    nxt = new._static[target].get(token, _NONE)
                    if nxt == _NONE:
                        nxt = new._new_node(target, token)
                        new._static[target][token] = nxt
                target = nxt
            new._add_stream(target)
        return new

    def to_bytes(self, *, node_count: int | None = None, stream_count: int | None = None) -> bytes:
        """Serializes the trie (thresholds, nodes and stream ids; not the cache).

        With ``node_count``/``stream_count``, only the first that many nodes and streams
        are written: the trie as :meth:`truncate` would leave it (the caller names counts
        the trie had at some point). Reading only those prefixes of append-only lists, it
        may run while another thread learns.

        Layout (little-endian): ``b"SLTS"``, version u8, CRC-32 u32, then the body:
        thresholds (u32 count, u32 each); node count u32 and, per non-root node in id
        order, parent u32 + edge kind u8 (0 static, then u32 length + UTF-8 token; 1
        ``+``); stream count u32 and each stream's end node u32 in stream id order.
        Replaying nodes in id order rebuilds the same ids, hence the same stream ids.
        """
        n_nodes = len(self._parent) if node_count is None else node_count
        n_streams = len(self._stream_node) if stream_count is None else stream_count
        if not _N_ROOTS <= n_nodes <= len(self._parent) or not 0 <= n_streams <= len(self._stream_node):
            raise InvalidArgument(f"no prefix of {n_nodes} nodes and {n_streams} streams in this LTS")
        parents = self._parent[:n_nodes]
        tokens = self._token[:n_nodes]
        ends = self._stream_node[:n_streams]
        body = bytearray()
        u32 = _U32.pack
        body += u32(len(self._thresholds))
        for thr in self._thresholds:
            body += u32(thr)
        body += u32(n_nodes)
        for node in range(_N_ROOTS, n_nodes):
            body += u32(parents[node])
            token = tokens[node]
            if token is None:
                body.append(_EDGE_PLUS)
            else:
                raw = token.encode("utf-8")
                body.append(_EDGE_STATIC)
                body += u32(len(raw))
                body += raw
        body += u32(n_streams)
        for node in ends:
            if node >= n_nodes:
                raise InvalidArgument("a stream of the prefix ends at a node outside it")
            body += u32(node)
        crc = zlib.crc32(body, zlib.crc32(_MAGIC + bytes([_VERSION])))
        return _HEADER.pack(_MAGIC, _VERSION, crc) + bytes(body)

    @classmethod
    def from_bytes(cls, data: bytes, *, cache_size: int = _DEFAULT_CACHE_SIZE) -> LTS:
        """Restores a trie written by :meth:`to_bytes`, with the same stream ids.

        Raises:
            CorruptLTS: If the magic, version, CRC or structure is wrong.
        """
        view = memoryview(data)
        if len(view) < _HEADER.size:
            raise CorruptLTS(f"LTS data is {len(view)} bytes, shorter than its {_HEADER.size}-byte header")
        magic, version, crc = _HEADER.unpack_from(view, 0)
        if magic != _MAGIC:
            raise CorruptLTS(f"bad LTS magic {bytes(magic)!r}")
        if version != _VERSION:
            raise CorruptLTS(f"unsupported LTS format version {version} (this build reads {_VERSION})")
        body = view[_HEADER.size :]
        if zlib.crc32(body, zlib.crc32(_MAGIC + bytes([_VERSION]))) != crc:
            raise CorruptLTS("LTS CRC mismatch")
        try:
            return cls._decode_body(body, cache_size)
        except (struct.error, UnicodeDecodeError, InvalidArgument) as exc:
            raise CorruptLTS(f"malformed LTS data: {exc}") from exc

    @classmethod
    def _decode_body(cls, body: memoryview, cache_size: int) -> LTS:
        pos = 0

        def u32() -> int:
            nonlocal pos
            (value,) = _U32.unpack_from(body, pos)
            pos += 4
            return int(value)

        n_thr = u32()
        if n_thr * 4 > len(body):
            raise CorruptLTS(f"LTS claims {n_thr} thresholds, more than the data holds")
        lts = cls([u32() for _ in range(n_thr)], cache_size=cache_size)
        n_nodes = u32()
        if n_nodes < _N_ROOTS:
            raise CorruptLTS(f"LTS has {n_nodes} nodes, fewer than its {_N_ROOTS} roots")
        for node in range(_N_ROOTS, n_nodes):
            parent = u32()
            if parent >= node:
                raise CorruptLTS(f"LTS node {node} has parent {parent}, not an earlier node")
            if pos >= len(body):
                raise CorruptLTS("LTS data ends inside a node")
            kind = body[pos]
            pos += 1
            if kind == _EDGE_PLUS:
                if lts._plus[parent] != _NONE:
                    raise CorruptLTS(f"LTS node {parent} has two '+' edges")
                lts._new_node(parent, None)
                lts._plus[parent] = node
            elif kind == _EDGE_STATIC:
                size = u32()
                if pos + size > len(body):
                    raise CorruptLTS("LTS data ends inside a token")
                token = bytes(body[pos : pos + size]).decode("utf-8")
                pos += size
                if token in lts._static[parent]:
                    raise CorruptLTS(f"LTS node {parent} has two edges {token!r}")
                lts._new_node(parent, token)
                lts._static[parent][token] = node
            else:
                raise CorruptLTS(f"LTS node {node} has unknown edge kind {kind}")
        n_streams = u32()
        for _ in range(n_streams):
            node = u32()
            if not _N_ROOTS <= node < n_nodes or lts._eot[node] != _NONE:
                raise CorruptLTS(f"LTS stream ends at invalid or repeated node {node}")
            lts._add_stream(node)
        if pos != len(body):
            raise CorruptLTS(f"{len(body) - pos} trailing bytes after the LTS data")
        return lts
