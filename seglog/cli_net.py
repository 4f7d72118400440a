"""The network commands of the ``seglog`` command line: a node server's API from a shell.

``seglog admin --url URL ...`` manages databases; ``seglog produce --url URL DB`` and
``seglog consume --url URL DB`` are the network forms of the embedded commands (``--url``
selects them, see :func:`network_mode`). Every request goes through
:class:`seglog.client._http.NodeSession`; consume reads with :class:`seglog.client.Consumer`.

Conventions beside the embedded commands' (``seglog.cli``): an error is one line
``seglog: <ErrorClass>: message`` on stderr and exit 1 (the class the server named, as the
embedded API would raise it); the token comes from ``--token`` or ``SEGLOG_TOKEN``.
``consume --follow`` ends cleanly (exit 0) on SIGINT or SIGTERM.

``seglog.cli`` imports this module only when it builds its parser or runs a network
command, and the client (aiohttp) only when a network command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import ssl
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from seglog.cli import (
    _RECORD_PREFIX,
    DEMO_FILTER,
    _BadLine,
    _Input,
    _int_at_least,
    _parse_time,
    _print_merged,
    _write,
    tier_report_lines,
)
from seglog.cluster import protocol
from seglog.db_config import validate_db_name
from seglog.errors import (
    InvalidArgument,
    InvalidRecord,
    Overloaded,
    RemoteError,
    SeglogError,
    StaleGeneration,
)
from seglog.record import Record, records_from_table
from seglog.topics import DEFAULT_LTS_THRESHOLDS, topic_matches

if TYPE_CHECKING:
    from seglog.client import Consumer
    from seglog.client._http import NodeSession

__all__ = [
    "add_admin_parser",
    "add_consume_parser",
    "add_produce_parser",
    "demo_network",
    "error_line",
    "network_mode",
    "run",
]

TOKEN_ENV: Final = "SEGLOG_TOKEN"
DEFAULT_BATCH_LINES: Final = 1000
DEFAULT_BATCH_BYTES: Final = 1 << 20
# Retries of a produce request the node refused as overloaded (503 Overloaded: nothing written).
OVERLOADED_RETRIES: Final = 10
_RETRY_MAX_S: Final = 5.0
_URL_FLAGS: Final = ("--u", "--ur", "--url")  # argparse accepts unique prefixes


def network_mode(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is ``produce``/``consume`` with ``--url`` (the network forms)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in ("produce", "consume"):
        return False
    for arg in argv[argv.index(command) + 1 :]:
        if arg == "--":
            return False
        if arg.split("=", 1)[0] in _URL_FLAGS:
            return True
    return False


def error_line(exc: BaseException) -> str:
    """``seglog: <ErrorClass>: message`` for a network command (notes appended)."""
    message = _connect_failure(exc) or str(exc) or type(exc).__name__
    notes = getattr(exc, "__notes__", None)
    if notes:
        message = "; ".join([message, *notes])
    return f"seglog: {type(exc).__name__}: {message}".replace("\n", " ")


def _connect_failure(exc: BaseException) -> str | None:
    """A clear message when no connection could be made (refused, no route, TLS)."""
    import aiohttp

    cause = exc.__cause__
    if not isinstance(cause, aiohttp.ClientConnectorError):
        return None
    where = f"{cause.host}:{cause.port}"
    if isinstance(cause, aiohttp.ClientConnectorCertificateError | aiohttp.ClientConnectorSSLError):
        return f"TLS with {where} failed: {getattr(cause, 'certificate_error', None) or cause.os_error}"
    errno = cause.os_error.errno
    reason = os.strerror(errno).lower() if errno else str(cause.os_error)
    return f"cannot connect to {where}: {reason} (is `seglog serve` listening there?)"


# --- parsers ---------------------------------------------------------------------------


def _connection_options(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """``--url``, ``--token``, ``--cacert``, ``--timeout-s`` (``suppress``: no defaults, so a
    subcommand repeating them does not reset what its parent parsed)."""
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--url", default=default, help="the node, http://HOST:PORT or https://HOST:PORT")
    parser.add_argument(
        "--token", default=default, help=f"bearer token (default: ${TOKEN_ENV}; prefer the variable)"
    )
    parser.add_argument("--cacert", default=default, help="PEM CA bundle to verify an https node with")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=argparse.SUPPRESS if suppress else 60.0,
        help="timeout of one request, beyond a long poll (default 60)",
    )


def add_produce_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """``seglog produce --url URL DB [--file F]``."""
    pr = sub.add_parser(
        "produce",
        parents=parents,
        help="send JSON lines of stdin (or --file) to a node",
        description="Send records to a database on a node: one JSON object per line, "
        '{"topic", "value", "key"?, "ts"?, "headers"?} (text as strings, other bytes as '
        '{"base64": "..."}: what `seglog consume` prints), in batches of at most --batch lines '
        "and --batch-bytes bytes per request.",
    )
    _connection_options(pr)
    pr.add_argument("db")
    pr.add_argument("--file", help="read lines from this file instead of stdin")
    pr.add_argument(
        "--shard", type=_int_at_least(0), help="append to this shard (default: the node routes by key/topic)"
    )
    pr.add_argument(
        "--acks",
        choices=("1", "quorum", "all"),
        help="a replicated database: when a request is acknowledged (default all; needs --shard "
        "and the shard's leader as --url)",
    )
    pr.add_argument(
        "--batch",
        type=_int_at_least(1),
        default=DEFAULT_BATCH_LINES,
        help=f"most lines per request (default {DEFAULT_BATCH_LINES})",
    )
    pr.add_argument(
        "--batch-bytes",
        type=_int_at_least(1),
        default=DEFAULT_BATCH_BYTES,
        help=f"most bytes per request (default {DEFAULT_BATCH_BYTES}; a longer line goes alone)",
    )
    pr.add_argument(
        "--linger-ms",
        type=_int_at_least(0),
        default=50,
        help="send a partial batch this long after its first line arrived (default 50)",
    )
    pr.set_defaults(network="produce")


def add_consume_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """``seglog consume --url URL DB [--group G] [--follow] ...``."""
    co = sub.add_parser(
        "consume",
        parents=parents,
        help="print records of a database on a node as JSON lines",
        description="Print records of a database on a node (each shard in offset order, shards "
        "interleaved as fetched) up to the end each shard had at the start, or with --follow "
        "until SIGINT/SIGTERM.",
    )
    _connection_options(co)
    co.add_argument("db")
    co.add_argument(
        "--shard",
        type=_int_at_least(0),
        action="append",
        help="only this shard (repeatable; default: every shard, or the group's share)",
    )
    start = co.add_mutually_exclusive_group()
    start.add_argument(
        "--from-beginning",
        dest="reset",
        action="store_const",
        const="earliest",
        help="shards without a commit start at their first record (the default)",
    )
    start.add_argument(
        "--latest",
        dest="reset",
        action="store_const",
        const="latest",
        help="shards without a commit start after their last record",
    )
    start.add_argument(
        "--from-time", help="shards without a commit start at this ISO 8601 time (UTC if naive)"
    )
    co.add_argument("--max", type=_int_at_least(1), help="stop after this many records")
    co.add_argument(
        "--topic",
        metavar="FILTER",
        help="only records whose topic matches this MQTT filter, read through the database's "
        "streams (it needs lts_thresholds); each stream from its start (or --from-time), "
        "streams interleaved; not with --group or --latest",
    )
    co.add_argument(
        "--group",
        help="consumer group: join it (shards split between members), start at its commits, "
        "commit as records print (at-least-once)",
    )
    co.add_argument("--format", choices=("json", "raw"), default="json")
    co.add_argument(
        "--follow", action="store_true", help="keep printing new records until SIGINT/SIGTERM (exit 0)"
    )
    co.set_defaults(network="consume", reset="earliest")


def add_admin_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """``seglog admin --url URL create|list|describe|configure|drop|stats|retention|tier ...``."""
    ad = sub.add_parser(
        "admin",
        parents=parents,
        help="create, list, describe, configure and drop databases on a node",
        description="Database administration on a node (`seglog serve`). The connection "
        "options go before or after the action.",
    )
    _connection_options(ad)
    ad.set_defaults(network="admin")
    actions = ad.add_subparsers(dest="action", required=True)

    def leaf(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = actions.add_parser(name, parents=parents, help=help_text)
        _connection_options(p, suppress=True)
        return p

    cr = leaf("create", "create a database")
    cr.add_argument("db")
    cr.add_argument("--shards", type=_int_at_least(1), help="shards (default 1; immutable)")
    cr.add_argument("--engine", help="storage engine (default segment; immutable)")
    cr.add_argument("--compression", choices=("none", "zstd"), help="frame compression (default none)")
    for flag, what in (
        ("--segment-bytes", "roll a segment at this size"),
        ("--segment-ms", "roll a segment at this age"),
        ("--max-record-bytes", "largest value accepted"),
        ("--retention-bytes", "keep at most this many bytes per shard"),
        ("--retention-ms", "keep records this long"),
    ):
        cr.add_argument(flag, type=_int_at_least(0), help=what)
    cr.add_argument(
        "--replication-factor",
        type=_int_at_least(1),
        help="replicas of each shard (a cluster node: seglog serve --etcd ...)",
    )
    cr.add_argument("--min-insync", type=_int_at_least(1), help="in-sync replicas acks=all needs")
    cr.add_argument(
        "--unclean-election", action="store_true", help="allow an out-of-sync replica to become leader"
    )
    cr.add_argument(
        "--exist-ok", action="store_true", help="no error if it exists with the same shards/engine"
    )
    _set_option(cr)

    leaf("list", "the databases the token may read").add_argument("--json", action="store_true")
    leaf("describe", "config and per-shard start, end and high watermark (JSON)").add_argument("db")
    cf = leaf("configure", "change mutable settings")
    cf.add_argument("db")
    _set_option(cf)
    leaf("drop", "delete a database and its data").add_argument("db")
    leaf("stats", "offsets, segments and bytes per shard").add_argument("--json", action="store_true")
    leaf("retention", "apply the database's retention settings now").add_argument("db")
    ti = leaf("tier", "upload sealed segments to the node's tier now (a node started with --tier)")
    ti.add_argument("db")
    ti.add_argument("--seal", action="store_true", help="seal the active segments first")
    leaf("generations", "the database's generations, one line each").add_argument("db")
    leaf("add-generation", "close the current generation and start the next").add_argument("db")
    dg = leaf("drop-generation", "drop a closed generation and the data only it holds")
    dg.add_argument("db")
    dg.add_argument("generation", type=_int_at_least(1))


def _set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any database setting (repeatable); VALUE is JSON (1000, null, true) or else a string",
    )


def _settings(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, found, text = item.partition("=")
        if not found or not name:
            raise InvalidArgument(f"--set {item!r}: expected NAME=VALUE")
        try:
            out[name.replace("-", "_")] = json.loads(text)
        except json.JSONDecodeError:
            out[name.replace("-", "_")] = text
    return out


# --- running ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Run a network command (``args.network`` names it)."""
    if args.network == "admin":
        return asyncio.run(_admin(args))
    if args.network == "produce":
        return asyncio.run(_produce(args))
    return asyncio.run(_consume(args))


def _token(args: argparse.Namespace) -> str | None:
    token: str | None = getattr(args, "token", None) or os.environ.get(TOKEN_ENV) or None
    return token


def _ssl(args: argparse.Namespace) -> ssl.SSLContext | None:
    cacert = getattr(args, "cacert", None)
    return None if cacert is None else ssl.create_default_context(cafile=cacert)


def _url(args: argparse.Namespace) -> str:
    url: str | None = getattr(args, "url", None)
    if not url:
        raise InvalidArgument("--url URL is required (the node, http://HOST:PORT)")
    return url


def _session(args: argparse.Namespace, *, pool_connections: int = 4) -> NodeSession:
    from seglog.client._http import NodeSession

    return NodeSession(
        _url(args),
        token=_token(args),
        ssl_context=_ssl(args),
        timeout_s=args.timeout_s,
        pool_connections=pool_connections,
    )


@contextlib.contextmanager
def _on_signals(handler: Callable[[], None]) -> Iterator[None]:
    """Call ``handler`` on SIGINT and SIGTERM (instead of KeyboardInterrupt / death) inside."""
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGINT, signal.SIGTERM)
    for sig in sigs:
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


def _db_path(db: str) -> str:
    validate_db_name(db)
    return f"{protocol.API_PREFIX}/dbs/{db}"


# --- admin -----------------------------------------------------------------------------


async def _admin(args: argparse.Namespace) -> int:
    session = _session(args)
    try:
        return await _admin_action(session, args)
    finally:
        await session.close()


async def _admin_action(session: NodeSession, args: argparse.Namespace) -> int:
    action = args.action
    if action == "list":
        names = (await session.request("GET", f"{protocol.API_PREFIX}/dbs")).json()["dbs"]
        if args.json:
            print(json.dumps(names))
        elif names:
            print("\n".join(names))
        return 0
    if action == "stats":
        dbs = (await session.request("GET", f"{protocol.API_PREFIX}/stats")).json()["dbs"]
        if args.json:
            print(json.dumps(dbs))
            return 0
        print(f"{'db':<16}{'shard':>6}{'start':>12}{'end':>12}{'segments':>9}{'bytes':>14}")
        for name, shards in dbs.items():
            for s in shards:
                print(
                    f"{name:<16}{s['shard']:>6}{s['start']:>12,}{s['end']:>12,}{s['segments']:>9}{s['bytes']:>14,}"
                )
        return 0
    path = _db_path(args.db)
    if action == "create":
        body: dict[str, Any] = _settings(args.set)
        for name in (
            "shards",
            "engine",
            "compression",
            "segment_bytes",
            "segment_ms",
            "max_record_bytes",
            "retention_bytes",
            "retention_ms",
            "replication_factor",
            "min_insync",
        ):
            value = getattr(args, name)
            if value is not None:
                body[name] = value
        if args.unclean_election:
            body["unclean_election"] = True
        body.update(name=args.db, exist_ok=args.exist_ok)
        desc = (await session.request("POST", f"{protocol.API_PREFIX}/dbs", json_body=body)).json()
        print(_created(desc))
    elif action == "describe":
        desc = (await session.request("GET", path)).json()
        if desc.get("replicated"):
            desc["replication"] = await _from_leaders(session, args, path, desc["replication"])
        print(json.dumps(desc, indent=2))
    elif action == "configure":
        changes = _settings(args.set)
        if not changes:
            raise InvalidArgument("configure needs --set NAME=VALUE")
        desc = (await session.request("PATCH", path, json_body=changes)).json()
        print(json.dumps({k: desc["config"][k] for k in changes if k in desc["config"]}))
    elif action == "retention":
        reply = (await session.request("POST", path + "/retention")).json()
        starts = ", ".join(f"shard {o['shard']} from {o['start']:,}" for o in reply["offsets"])
        print(f"freed {reply['freed_bytes']:,} bytes; {starts}")
    elif action == "tier":
        reply = (await session.request("POST", path + "/tier", json_body={"seal": args.seal})).json()
        print("\n".join(tier_report_lines(reply["committed"], reply["tier"])))
    elif action == "generations":
        for slab in (await session.request("GET", path + "/generations")).json()["generations"]:
            print(_generation_line(slab))
    elif action == "add-generation":
        slab = (await session.request("POST", path + "/generations")).json()
        print(f"added {_generation_line(slab)}")
    elif action == "drop-generation":
        reply = (await session.request("DELETE", f"{path}/generations/{args.generation}")).json()
        print(f"dropped generation {reply['generation']} of {args.db}; freed {reply['freed_bytes']:,} bytes")
    else:  # drop
        await session.request("DELETE", path)
        print(f"dropped {args.db}")
    return 0


def _generation_line(slab: dict[str, Any]) -> str:
    """``generation 2 (current): shard 0 from 5, shard 1 from 0`` (closed ones: ``5..9``)."""
    state = "current" if slab["current"] else "dropped" if slab["dropped"] else "closed"
    until = slab["until"] or [None] * len(slab["since"])
    spans = ", ".join(
        f"shard {i} from {a:,}" if b is None else f"shard {i} {a:,}..{b:,}"
        for i, (a, b) in enumerate(zip(slab["since"], until, strict=True))
    )
    return f"generation {slab['generation']} ({state}): {spans}"


async def _from_leaders(
    session: NodeSession, args: argparse.Namespace, path: str, shards: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each shard's replication entry as its leader reports it (high watermark and every
    replica's lag are known only there); a leader that does not answer keeps the entry
    ``--url``'s node gave, with ``"leader_unreachable": true``."""
    from seglog.client._http import NodeSession

    nodes = (await session.request("GET", f"{protocol.API_PREFIX}/cluster")).json()["nodes"]
    out = list(shards)
    for leader in sorted({int(s["leader"]) for s in shards if not s.get("led_here") and s["leader"] > 0}):
        url = nodes.get(str(leader))
        mine = [i for i, s in enumerate(shards) if s["leader"] == leader and not s.get("led_here")]
        if url is None:
            for i in mine:
                out[i] = {**shards[i], "leader_unreachable": True}
            continue
        other = NodeSession(url, token=_token(args), ssl_context=_ssl(args), timeout_s=args.timeout_s)
        try:
            theirs = {s["shard"]: s for s in (await other.request("GET", path)).json().get("replication", [])}
        except SeglogError:
            theirs = {}
        finally:
            await other.close()
        for i in mine:
            entry = theirs.get(shards[i]["shard"])
            out[i] = (
                entry
                if entry is not None and entry.get("led_here")
                else {**shards[i], "leader_unreachable": True}
            )
    return out


def _created(desc: dict[str, Any]) -> str:
    """One line for a create reply (a local database's description, or a replicated one's placement)."""
    what = f"{desc['name']}: {desc['shards']} shards"
    if "replication_factor" in desc:
        what += f", replication factor {desc['replication_factor']}, min_insync {desc['min_insync']}"
    elif "config" in desc:
        what += f", engine {desc['config']['engine']}"
    return ("created " if desc.get("created", True) else "exists: ") + what


# --- produce ---------------------------------------------------------------------------


class _NetProducer:
    """Lines -> JSON-lines requests of at most ``--batch`` lines / ``--batch-bytes`` bytes,
    sent when full or ``--linger-ms`` after their first line; one request at a time."""

    def __init__(self, session: NodeSession, args: argparse.Namespace) -> None:
        self.session = session
        self.db: str = args.db
        self.path = _db_path(args.db) + "/records"
        self.params: dict[str, str | int] = {}
        if args.shard is not None:
            self.params["shard"] = args.shard
        if args.acks is not None:
            self.params["acks"] = args.acks
        self.max_lines: int = args.batch
        self.max_bytes: int = args.batch_bytes
        self.linger_s: float = args.linger_ms / 1000
        self.lines: list[bytes] = []
        self.line_nos: list[int] = []  # input line number of each (blank lines are not sent)
        self.nbytes = 0
        self.carry: tuple[int, bytes] | None = None  # a line that did not fit the batch
        self.line_no = 0
        self.stored = 0
        self.ranges: dict[int, list[int]] = {}  # shard -> [count, first offset, last offset]
        self.deadline: float | None = None
        self.stopped = False
        self.wake = asyncio.Event()

    def interrupt(self) -> None:
        self.stopped = True
        self.wake.set()

    def _full(self) -> bool:
        return self.carry is not None or len(self.lines) >= self.max_lines or self.nbytes >= self.max_bytes

    def _add(self, no: int, line: bytes) -> None:
        if self.lines and self.nbytes + len(line) + 1 > self.max_bytes:
            self.carry = (no, line)
            return
        if not self.lines:
            self.deadline = asyncio.get_running_loop().time() + self.linger_s
        self.lines.append(line)
        self.line_nos.append(no)
        self.nbytes += len(line) + 1

    def _take(self, source: _Input) -> None:
        if self.carry is not None and not self.lines:
            (no, line), self.carry = self.carry, None
            self._add(no, line)
        while source.lines and not self._full():
            line = source.take()
            self.line_no += 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.strip():
                self._add(self.line_no, line)

    async def _post(self, lines: list[bytes]) -> dict[str, Any]:
        delay = 0.1
        for attempt in range(OVERLOADED_RETRIES + 1):
            try:
                reply = await self.session.request(
                    "POST",
                    self.path,
                    params=self.params,
                    data=b"\n".join(lines),
                    content_type=protocol.NDJSON,
                )
                result: dict[str, Any] = reply.json()
                return result
            except Overloaded as exc:  # refused before anything was written: safe to resend
                if attempt == OVERLOADED_RETRIES:
                    raise
                await asyncio.sleep(min(exc.retry_after_s or delay, _RETRY_MAX_S))
                delay = min(delay * 2, _RETRY_MAX_S)
        raise AssertionError("unreachable")

    def _stored(self, reply: dict[str, Any]) -> None:
        self.stored += int(reply["count"])
        for part in reply["parts"]:
            base, count = int(part["base_offset"]), int(part["count"])
            r = self.ranges.setdefault(int(part["shard"]), [0, base, base])
            r[0] += count
            r[1] = min(r[1], base)
            r[2] = max(r[2], base + count - 1)

    async def flush(self) -> None:
        """Send the batch; on an invalid record, send the lines before it and raise."""
        lines, nos = self.lines, self.line_nos
        self.lines, self.line_nos, self.nbytes, self.deadline = [], [], 0, None
        n = len(lines)
        bad: InvalidRecord | None = None
        while n:
            try:
                reply = await self._post(lines[:n])
            except InvalidRecord as exc:
                if exc.index is None or not 0 <= exc.index < n:
                    exc.add_note(self.after(nos[0]))
                    raise
                bad, n = exc, exc.index  # the lines before it go; the first bad one may be earlier
                continue
            except SeglogError as exc:
                exc.add_note(self.after(nos[0], nos[n - 1], _ambiguous(exc)))
                raise
            self._stored(reply)
            break
        if bad is not None and bad.index is not None:
            raise _BadLine(nos[bad.index], _RECORD_PREFIX.sub("", str(bad)))

    async def run(self, source: _Input) -> None:
        """Until end of input or :meth:`interrupt`; what was read is sent either way."""
        loop = asyncio.get_running_loop()
        while not self.stopped:
            self._take(source)
            if self._full():
                await self.flush()
                continue
            if source.eof and not source.lines:
                break
            if not source.pollable:
                source.read_more()
                await asyncio.sleep(0)  # let a signal be handled between chunks
                continue
            if self.deadline is not None and loop.time() >= self.deadline:
                await self.flush()
                continue
            self.wake.clear()
            timeout = None if self.deadline is None else self.deadline - loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
        # End of input or a signal: every line read so far is sent.
        while source.lines or self.carry is not None or self.lines:
            self._take(source)
            await self.flush()
        if source.error is not None:
            raise source.error

    def where(self) -> str:
        return ", ".join(
            f"shard {s}: {c} at {lo}" + (f"..{hi}" if hi != lo else "")
            for s, (c, lo, hi) in sorted(self.ranges.items())
        )

    def summary(self) -> str:
        if not self.stored:
            return f"produced 0 records to {self.db}"
        return f"produced {self.stored} records to {self.db} ({self.where()})"

    def after(self, first: int, last: int | None = None, ambiguous: bool = False) -> str:
        """What was stored, for an error at input line ``first`` (batch ``first..last``)."""
        if self.stored:
            done = (
                f"the {self.stored} records before line {first} were produced to {self.db} ({self.where()})"
            )
        else:
            done = "nothing was produced"
        if ambiguous:
            return f"{done}; whether lines {first}..{last} were stored is unknown"
        return f"{done}, nothing from line {first} on"


def _ambiguous(exc: SeglogError) -> bool:
    """Whether a failed produce request may have been written (the connection broke)."""
    import aiohttp

    if not isinstance(exc, RemoteError) or isinstance(exc, Overloaded):
        return False
    return not isinstance(exc.__cause__, aiohttp.ClientConnectorError)  # never connected: not sent


async def _produce(args: argparse.Namespace) -> int:
    if not args.file and sys.stdin is None:
        raise InvalidArgument("stdin is closed: pipe JSON lines in or use --file")
    session = _session(args)
    producer = _NetProducer(session, args)
    file: IO[bytes] | None = None
    source: _Input | None = None
    try:
        # Fail before reading any input: the node, the token and the database.
        desc = (await session.request("GET", _db_path(args.db))).json()
        if args.shard is not None and not 0 <= args.shard < desc["shards"]:
            raise InvalidArgument(f"--shard {args.shard}: {args.db} has shards 0..{desc['shards'] - 1}")
        file = open(args.file, "rb") if args.file else None  # noqa: SIM115
        fd = file.fileno() if file is not None else sys.stdin.fileno()
        source = _Input(fd, producer.wake, max_lines=4 * args.batch)
        with _on_signals(producer.interrupt):
            await producer.run(source)
    except _BadLine as bad:
        raise InvalidRecord(f"line {bad.line}: {bad.message}; {producer.after(bad.line)}") from None
    finally:
        if source is not None:
            source.close()
        if file is not None:
            file.close()
        await session.close()
    if producer.stopped:
        print(f"interrupted: {producer.summary()}", file=sys.stderr)
        return 130
    print(producer.summary(), file=sys.stderr)
    return 0


# --- consume ---------------------------------------------------------------------------


async def _consume(args: argparse.Namespace) -> int:
    from seglog.client import Consumer

    validate_db_name(args.db)
    if args.topic is not None:
        return await _consume_topic(args)

    def consumer(shards: list[int] | None, group: str | None = None) -> Consumer:
        return Consumer(
            _url(args),
            args.db,
            group=group,
            shards=shards,
            token=_token(args),
            ssl=_ssl(args),
            auto_offset_reset=args.reset,
            from_time_us=None if args.from_time is None else _parse_time(args.from_time),
            request_timeout_s=args.timeout_s,
        )

    async def body() -> None:
        if not args.follow and args.group is None:
            await _print_merged_shards(consumer, args)
            return
        async with consumer(
            args.shard, args.group
        ) as live:  # a signal cancels wherever it waits: it still stops (and leaves its group)
            await _print_records(live, args)

    return await _until_signalled(body, follow=args.follow)


async def _print_merged_shards(
    consumer: Callable[[list[int] | None], Consumer], args: argparse.Namespace
) -> None:
    """``consume --url`` without ``--follow`` or ``--group``: every shard up to the end it had
    at the start, merged by (ts, shard, offset) as the local command prints them (one
    consumer per shard, so that each is read only as far as the merge has come)."""
    shards = args.shard
    if shards is None:
        session = _session(args, pool_connections=1)
        try:
            shards = range(
                int((await session.request("GET", f"{protocol.API_PREFIX}/dbs/{args.db}")).json()["shards"])
            )
        finally:
            await session.close()
    async with contextlib.AsyncExitStack() as stack:
        sources = {}
        for shard in sorted(set(shards)):
            one = await stack.enter_async_context(consumer([shard]))
            (end,) = (await one.end_offsets([shard])).values()
            sources[shard] = _shard_until(one, shard, end)
        await _print_merged(sources, args, None)


async def _shard_until(consumer: Consumer, shard: int, end: int) -> AsyncGenerator[pa.Table, None]:
    """The records of ``consumer``'s one shard below ``end``, a table at a time."""
    while consumer.position(shard) < end:
        table = (await consumer.getmany_arrow(timeout_ms=_MERGED_WAIT_MS, max_records=1000)).get(shard)
        if table is not None and table.num_rows:
            kept = table.filter(pc.less(table.column("offset"), end))
            if kept.num_rows:
                yield kept  # an empty table would end the shard in _print_merged


async def _until_signalled(body: Callable[[], Awaitable[None]], *, follow: bool) -> int:
    """Run ``body``; SIGINT/SIGTERM cancel it wherever it waits: exit 0 when following (the
    way to stop), else 130 (interrupted)."""
    task = asyncio.current_task()
    assert task is not None
    signalled = False

    def stop() -> None:
        nonlocal signalled
        if not signalled:
            signalled = True
            task.cancel()

    try:
        with _on_signals(stop):
            await body()
    except asyncio.CancelledError:
        if not signalled:
            raise
        task.uncancel()
        return 0 if follow else 130
    return 0


# The long poll of each shard's reads in ``consume --url`` without ``--follow``.
_MERGED_WAIT_MS: Final = 500
# How often ``consume --url --topic --follow`` asks for streams learned since it started.
STREAMS_REFRESH_S: Final = 5.0
# The long poll of one round of `consume --url --topic --follow` (all its streams at once).
_STREAM_WAIT_MS: Final = 1000


async def _consume_topic(args: argparse.Namespace) -> int:
    """``consume --url URL DB --topic FILTER``: the filter's records through the streams API."""
    from seglog.client import StreamReader

    if args.group is not None:
        raise InvalidArgument("--topic reads streams, not a group's shards: drop --group")
    if args.reset == "latest":
        raise InvalidArgument("--topic reads each stream from its start (or --from-time): drop --latest")
    start_us = 0 if args.from_time is None else _parse_time(args.from_time)
    shards = None if args.shard is None else set(args.shard)
    reader = StreamReader(
        _url(args), args.db, token=_token(args), ssl=_ssl(args), request_timeout_s=args.timeout_s
    )

    async def body() -> None:
        async with reader:
            await _print_streams(reader, args, start_us, shards)

    return await _until_signalled(body, follow=args.follow)


async def _stream_round(
    reader: Any, iterators: list[Any], n: int, wait_ms: int
) -> tuple[list[tuple[Any, pa.Table]], bool]:
    """One ``next_many`` over ``iterators``, which it replaces in place by the moved ones still
    open, rotated so that the budget goes round; returns the results and whether the round
    read records or moved an iterator (a round that did neither found everything read)."""
    before = [it.position for it in iterators]
    results = await reader.next_many(iterators, n, wait_ms=wait_ms)
    progressed = any(t.num_rows for _, t in results) or [it.position for it, _ in results] != before
    live = [it for it, _ in results if not it.end_of_stream]
    iterators[:] = live[1:] + live[:1]
    return results, progressed


async def _print_streams(
    reader: Any, args: argparse.Namespace, start_us: int, shards: set[int] | None
) -> None:
    """Print the records of every stream of ``--topic`` (up to ``--max``), all streams read by
    one request per round (``next_many``, rotated so that no stream starves the others):
    without ``--follow`` until a round finds nothing; with it, a long poll per round, and
    streams learned later are picked up every :data:`STREAMS_REFRESH_S`."""
    remaining: int | None = args.max
    known: set[tuple[int, int, int]] = set()
    iterators: list[Any] = []

    async def start_new() -> None:
        new = []
        for stream in await reader.get_streams(args.topic, start_us):
            key = (stream.generation, stream.shard, stream.id)
            if key not in known and (shards is None or stream.shard in shards):
                known.add(key)
                new.append(stream)
        if new:
            iterators.extend(await reader.make_iterators(new, args.topic, start_us))

    await start_new()
    refresh_at = time.monotonic() + STREAMS_REFRESH_S
    while (iterators or args.follow) and (remaining is None or remaining > 0):
        if not iterators:  # following a filter no stream matches yet
            await asyncio.sleep(max(0.0, refresh_at - time.monotonic()))
            await start_new()
            refresh_at = time.monotonic() + STREAMS_REFRESH_S
            continue
        wait_ms = _STREAM_WAIT_MS if args.follow else 0
        results, progressed = await _stream_round(reader, iterators, min(remaining or 1000, 1000), wait_ms)
        for it, table in results:
            records = records_from_table(table, it.shard)[: remaining if remaining is not None else None]
            _write(records, args)
            if remaining is not None:
                remaining -= len(records)
        if not args.follow and not progressed:
            return
        if args.follow and time.monotonic() >= refresh_at:
            await start_new()
            refresh_at = time.monotonic() + STREAMS_REFRESH_S


async def _print_records(consumer: Consumer, args: argparse.Namespace) -> None:
    """Print (and with a group commit) up to ``--max`` records; without ``--follow`` stop at
    the end each shard had when the consumer started (or got the shard)."""
    remaining: int | None = args.max
    ends: dict[int, int] = {}
    while remaining is None or remaining > 0:
        if not args.follow:
            new = [s for s in consumer.assignment() if s not in ends]
            if new:
                ends.update(await consumer.end_offsets(new))
                continue  # the assignment may have moved during the await
            if all(consumer.position(s) >= ends[s] for s in consumer.assignment()):
                return
        got = await consumer.getmany(
            timeout_ms=None if args.follow else 500, max_records=min(remaining or 1000, 1000)
        )
        for recs in got.values():
            _write(recs, args)
            if remaining is not None:
                remaining -= len(recs)
        if args.group is not None and got:
            offsets = {
                shard: recs[-1].offset + 1 for shard, recs in got.items() if recs[-1].offset is not None
            }
            try:
                await consumer.commit(offsets)  # after printing: at-least-once
            except StaleGeneration as exc:
                print(
                    f"seglog: warning: commit refused ({type(exc).__name__}: {exc}); another member "
                    "owns these shards now and may print their records again",
                    file=sys.stderr,
                    flush=True,
                )


# --- the demo's network step -------------------------------------------------------------

DEMO_NET_DB: Final = "telemetry"
DEMO_NET_IN_FLIGHT: Final = 4
_SERVE_TIMEOUT_S: Final = 60.0
_SERVING: Final = re.compile(rb"seglog: serving .* on (https?://\S+)")


def demo_tables(records: Sequence[Record], batch_records: int) -> list[pa.Table]:
    """``records`` as Arrow tables of ``batch_records`` rows (columns as ``append_arrow``)."""
    table = pa.table(
        {
            "ts": pa.array([r.ts for r in records], pa.int64()),
            "topic": pa.array([r.topic for r in records], pa.string()),
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
        }
    )
    return [table.slice(i, batch_records) for i in range(0, table.num_rows, batch_records)]


async def _demo_network_produce(
    url: str, db: str, tables: Sequence[pa.Table], *, token: str | None = None
) -> int:
    """Send ``tables`` to ``db`` on the node with :class:`seglog.client.Producer` (Arrow path);
    return the count the node acknowledged (durably stored)."""
    from seglog.client import Producer

    async with Producer(url, db, token=token, acks="all", max_in_flight=DEMO_NET_IN_FLIGHT) as producer:
        futures = [await producer.send_arrow(table) for table in tables]
        await producer.flush()
        results = [await f for f in futures]
    return sum(r.num_rows for r in results)


async def _demo_network_consume(url: str, db: str, expected: int) -> int:
    """Read every shard of ``db`` from the start with ``getmany_arrow`` until ``expected`` rows."""
    from seglog.client import Consumer

    total = 0
    async with Consumer(url, db) as consumer:
        while total < expected:
            got = await consumer.getmany_arrow(timeout_ms=30_000)
            if not got:
                raise SeglogError(f"consumer got nothing for 30 s after {total:,} of {expected:,} records")
            total += sum(t.num_rows for t in got.values())
    return total


class _DemoNode:
    """A ``seglog serve`` child of the demo on ``data``, on a free loopback port."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: asyncio.subprocess.Process | None = None
        self.output: list[bytes] = []
        self.url = ""

    async def start(self) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "seglog.cli",
            "serve",
            str(self.data),
            "--listen",
            "127.0.0.1:0",
            "--fsync",
            "always",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        async with asyncio.timeout(_SERVE_TIMEOUT_S):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    await self.proc.wait()
                    raise SeglogError(
                        f"`seglog serve` exited with {self.proc.returncode}: {b''.join(self.output).decode()}"
                    )
                self.output.append(line)
                m = _SERVING.search(line)
                if m:
                    self.url = m.group(1).decode()
                    return self.url

    async def stop(self) -> None:
        """SIGTERM, then wait for its graceful exit (it must exit 0)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(self.proc.communicate(), _SERVE_TIMEOUT_S)
        self.output.append(out)
        if self.proc.returncode != 0:
            raise SeglogError(
                f"`seglog serve` exited with {self.proc.returncode}: {b''.join(self.output).decode()}"
            )

    async def kill(self) -> None:
        """SIGKILL a node still running (the demo failed part-way) and reap it."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def _demo_network_streams(url: str, db: str) -> tuple[int, int]:
    """Read :data:`DEMO_FILTER` through the node's streams: (records, streams)."""
    from seglog.client import StreamReader

    async with StreamReader(url, db) as reader:
        iterators = await reader.make_iterators(await reader.get_streams(DEMO_FILTER), DEMO_FILTER)
        streams = len(iterators)
        total = 0
        while iterators:
            results, progressed = await _stream_round(reader, iterators, 10_000, 0)
            total += sum(t.num_rows for _, t in results)
            if not progressed:
                break
        return total, streams


async def demo_network(node_dir: Path, records: Sequence[Record], shards: int, batch_records: int) -> None:
    """Start ``seglog serve`` on ``node_dir``, send ``records`` through it as Arrow, read them
    all back with a network consumer, print both rates, stop the server with SIGTERM.

    Raises:
        SeglogError: The counts differ, or the server failed.
    """
    from seglog.client._http import NodeSession

    node = _DemoNode(node_dir)
    print("\nstarting `seglog serve` (fsync=always) for the network step ...")
    try:
        url = await node.start()
        admin = NodeSession(url)
        try:
            body = {"name": DEMO_NET_DB, "shards": shards, "lts_thresholds": list(DEFAULT_LTS_THRESHOLDS)}
            await admin.request("POST", f"{protocol.API_PREFIX}/dbs", json_body=body)
        finally:
            await admin.close()
        tables = demo_tables(records, batch_records)
        n = len(records)
        t0 = time.perf_counter()
        acked = await _demo_network_produce(url, DEMO_NET_DB, tables)
        produce_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        consumed = await _demo_network_consume(url, DEMO_NET_DB, acked)
        consume_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        matched, streams = await _demo_network_streams(url, DEMO_NET_DB)
        streams_s = time.perf_counter() - t0
        await node.stop()
    finally:
        await node.kill()
    print(f"{'node':<22}{url} (data in {node_dir}), stopped with SIGTERM")
    print(
        f"{'produced (Producer)':<22}{acked:>14,} records in {produce_s:6.2f} s  = "
        f"{acked / produce_s:>12,.0f} records/s (seglog.client.Producer, acks=all, durable)"
    )
    print(
        f"{'consumed (HTTP arrow)':<22}{consumed:>14,} records in {consume_s:6.2f} s  = "
        f"{consumed / consume_s:>12,.0f} records/s (Consumer.getmany_arrow)"
    )
    expected = sum(1 for r in records if topic_matches(DEMO_FILTER, r.topic))
    print(
        f"{'wildcard (HTTP)':<22}{DEMO_FILTER} -> {matched:,} records from {streams} streams in "
        f"{streams_s * 1000:.1f} ms (StreamReader.next_many)"
    )
    if not acked == consumed == n:
        raise SeglogError(f"network step: sent {n:,}, acknowledged {acked:,}, consumed {consumed:,}")
    if matched != expected:
        raise SeglogError(f"network step: {DEMO_FILTER} read {matched:,} records, {expected:,} match")
    print(f"{'network check':<22}sent = acknowledged = consumed = {n:,}; wildcard = {expected:,} matching")
