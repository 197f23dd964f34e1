"""A seeded generator of hostile STOMP frames, as bytes, for the broker fuzz test.

Pure and deterministic: the same seed gives the same frames for the same connection history
(versions negotiated, ack ids harvested), so a failure is reproduced by re-running with the
printed seed. Every case is one frame (or one cut-off frame); a batch of cases is written
pipelined on one connection. The kinds below are the attack classes of issue 12; the env
var AMQLITE_FUZZ_KINDS (comma list) restricts generation to some of them for triage.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field

#: The case kinds and their relative weights (most frames keep the stream in sync so one
#: connection carries many cases; cut frames end their connection).
KIND_WEIGHTS: dict[str, int] = {
    "send-int": 14,      # hostile integers in priority/expires/producerSeq
    "send-string": 16,   # hostile destinations, producer ids, header names and values
    "send-body": 8,      # bodies with and without content-length, binary, NULs
    "subscribe": 8,      # SUBSCRIBE with hostile ids, ack modes, prefetch, durable names
    "unsubscribe": 3,
    "ack": 10,           # ACK/NACK of harvested, unknown and hostile ids, in or out of tx
    "tx": 12,            # BEGIN/COMMIT/ABORT, SENDs and ACKs mixing valid and invalid
    "headers": 8,        # duplicated and missing headers, escapes, CRLF, on any command
    "garbage": 3,        # unknown/lowercase commands, byte-flipped frames
    "cut": 3,            # a frame cut mid-way, or content-length past the end: connection ends
    "disconnect": 1,     # DISCONNECT (with or without receipt): connection ends
}
ALL_KINDS = tuple(KIND_WEIGHTS)

CLIENT_COMMANDS = (b"SEND", b"SUBSCRIBE", b"UNSUBSCRIBE", b"ACK", b"NACK", b"BEGIN",
                   b"COMMIT", b"ABORT", b"DISCONNECT")

#: Integers a careless or hostile client writes: Python-only syntax (`1_0`, non-ASCII
#: digits), signs, blanks, the int32/int64/uint64 edges of store columns, 5,000 digits.
HOSTILE_INTS: tuple[bytes, ...] = tuple(s.encode() for s in (
    "0", "1", "-1", "4", "9", "10", "-0", "+1", "01", "1_0", "\u0663", "\uff11\uff12",
    "\u00b2", " 1", "1 ", "", "abc", "1.5", "1e3", "0x1F", "2147483647", "2147483648",
    "-2147483649", "4294967296", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "-9223372036854775809", "18446744073709551616", "9" * 40,
    "9" * 5000, "1" * 5000, "-" + "9" * 5000, "NaN", "inf",
))

#: Lengths around the store's column widths (64, 200, 512) and the codec's header limit.
EDGE_LENGTHS = (0, 1, 63, 64, 65, 199, 200, 201, 255, 256, 511, 512, 513, 1000, 5000)

#: Hostile header values: NUL and frame injection, CR/LF/colon, escapes (valid and invalid
#: for 1.1/1.2), control characters, non-ASCII, invalid UTF-8 (lone continuation, overlong,
#: surrogate, past U+10FFFF).
HOSTILE_STRINGS: tuple[bytes, ...] = (
    b"", b"a", b"\xc3\xa9", "\u65e5\u672c\u8a9e".encode(), "\U0001f600".encode(),
    "\u200b\ufeff".encode(), b"\x00", b"a\x00b", b"x\x00RECEIPT\nreceipt-id:forged\n\n",
    b"x\x00ERROR\nmessage:forged\n\n", b"a:b", b"a\rb", b"tail\r", b"\\n", b"\\c",
    b"\\\\", b"\\r", b"\\t", b"\\", b"trailing\\", b"\x01\x02\x1b\x7f", b"%00", b"\xff",
    b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\x80b", b"\xe6\x97",
    b"  padded  ", b"null", b"true", b"false",
)

#: Header names: reserved ones (the broker's own, STOMP's), escapes, invalid UTF-8, empty.
HOSTILE_NAMES: tuple[bytes, ...] = (
    b"custom", b"x-fuzz", b"", b"a\\cb", b"a\\nb", b"a\\rb", b"a\\tb", b"\xff", b"\xc3\xa9",
    b"a b", b"a\rb", b"a\x00b", b"x" * 300, b"destination", b"content-length", b"receipt",
    b"receipt-id", b"message-id", b"subscription", b"ack", b"id", b"amqlite.producerId",
    b"amqlite.producerSeq", b"amqlite.deliveryCount", b"expires", b"priority",
    b"persistent", b"transaction", b"redelivered", b"content-type", b"reply-to",
    b"activemq.prefetchSize", b"selector", b"client-id", b"version", b"heart-beat",
)

ACK_MODES = (b"auto", b"client", b"client-individual", b"", b"AUTO", b"client-individua",
             b"\xff", b"client\x00")

_ACK_RE = re.compile(rb"\nack:([^\r\n\x00]*)")
_MID_RE = re.compile(rb"\nmessage-id:([^\r\n\x00]*)")
_SUB_RE = re.compile(rb"\nsubscription:([^\r\n\x00]*)")
_CASE_RECEIPT_RE = re.compile(rb"\nreceipt:(c\d+)\r?\n")
#: Ack ids remembered per connection (recent MESSAGE frames): enough to ACK real messages.
HARVEST_KEEP = 32


@dataclass(slots=True)
class Case:
    """One generated frame. `terminal`: the stream can no longer be trusted to be in sync
    (cut frame, content-length past the end, DISCONNECT), so the connection ends after it."""

    kind: str
    data: bytes
    terminal: bool = False

    @property
    def receipt(self) -> bytes | None:
        """The case's own receipt id (c<N>), to tell which cases the broker answered."""
        m = _CASE_RECEIPT_RE.search(self.data)
        return m.group(1) if m else None

    def describe(self, limit: int = 400) -> str:
        data = self.data if len(self.data) <= limit else (
            self.data[:limit] + b"...(%d bytes)" % len(self.data))
        return f"[{self.kind}{' terminal' if self.terminal else ''}] {data!r}"


@dataclass
class ConnState:
    """What one fuzz connection knows: its version, subscriptions, open transactions and
    the ack ids of MESSAGE frames it received (so ACKs can name real messages)."""

    version: str = "1.2"
    subs: list[tuple[bytes, bytes]] = field(default_factory=list)  # (id, destination)
    txs: list[bytes] = field(default_factory=list)
    ack_ids: deque[bytes] = field(default_factory=lambda: deque(maxlen=HARVEST_KEEP))
    message_ids: deque[bytes] = field(default_factory=lambda: deque(maxlen=HARVEST_KEEP))
    sub_ids_seen: deque[bytes] = field(default_factory=lambda: deque(maxlen=HARVEST_KEEP))

    def harvest(self, received: bytes) -> None:
        """Remember ids from MESSAGE frames the broker sent."""
        if b"MESSAGE" not in received:
            return
        self.ack_ids.extend(_ACK_RE.findall(received)[-HARVEST_KEEP:])
        self.message_ids.extend(_MID_RE.findall(received)[-HARVEST_KEEP:])
        self.sub_ids_seen.extend(_SUB_RE.findall(received)[-HARVEST_KEEP:])


def frame(command: bytes, headers: list[tuple[bytes, bytes]], body: bytes = b"",
          eol: bytes = b"\n") -> bytes:
    """Serialise as given: no escaping, no content-length added (the case decides)."""
    return b"".join((command, eol, *(k + b":" + v + eol for k, v in headers), eol, body,
                     b"\x00"))


class Mutator:
    """Generates cases for connections; one instance per worker (not thread-safe)."""

    def __init__(self, seed: int, *, canary_queue: str, canary_topic: str,
                 fuzz_queues: list[str], fuzz_topics: list[str],
                 kinds: tuple[str, ...] = ALL_KINDS) -> None:
        unknown = set(kinds) - set(ALL_KINDS)
        if unknown:
            raise ValueError(f"unknown fuzz kinds {sorted(unknown)}; known: {ALL_KINDS}")
        self.rng = random.Random(seed)
        self.canary_queue = canary_queue.encode()
        self.canary_topic = canary_topic.encode()
        self.fuzz_queues = [q.encode() for q in fuzz_queues]
        self.fuzz_topics = [t.encode() for t in fuzz_topics]
        self.kinds = list(kinds)
        self.weights = [KIND_WEIGHTS[k] for k in kinds]
        self.counter = 0
        base = b"/queue/fz-"
        self.hostile_destinations: tuple[bytes, ...] = (
            b"/queue/", b"/queue", b"/topic/", b"queue/x", b"", b"/queue/\xc3\xa9",
            "/topic/\u65e5\u672c".encode(), b"/queue/a\x00b", b"/queue/a\\cb",
            b"/queue/a\\nb", b"/queue/\xff", b"/queue/a b", b"/temp-queue/x",
            b"/queue/a/../b", b"/QUEUE/x", self.canary_queue + b"\r", b"/queue/\\t",
            *(base + b"q" * (n - len(base)) for n in (199, 200, 201, 511, 512, 513, 5000)),
        )
        #: The same minus the canary queue with a trailing CR: written as a header line
        #: it ends in CRLF, a valid line end, so it *is* the canary queue, and a
        #: SUBSCRIBE to it steals the canary's messages (fuzz runs lost canary messages so).
        self.subscribe_destinations = tuple(
            d for d in self.hostile_destinations if d.rstrip(b"\r") != self.canary_queue)

    # -- pools ------------------------------------------------------------------------
    def uid(self, prefix: bytes) -> bytes:
        self.counter += 1
        return prefix + b"%d" % self.counter

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, seq):  # type: ignore[no-untyped-def]
        return seq[self.rng.randrange(len(seq))]

    def hostile_string(self) -> bytes:
        r = self.rng.random()
        if r < 0.55:
            return self.pick(HOSTILE_STRINGS)
        if r < 0.85:
            return b"s" * self.pick(EDGE_LENGTHS)
        return bytes(self.rng.randrange(1, 256) for _ in range(self.rng.randrange(1, 12)))

    def some_value(self) -> bytes:
        """Usually harmless, often hostile."""
        return self.uid(b"v") if self.chance(0.4) else self.hostile_string()

    def destination(self, *, for_subscribe: bool = False) -> bytes:
        """A destination; a SUBSCRIBE never takes the canary queue, under any spelling
        the broker reads as it (it would steal the canary's messages), a SEND goes there
        often so hostile headers reach the canary."""
        r = self.rng.random()
        if r < 0.25 and not for_subscribe:
            return self.canary_queue
        if r < 0.40:
            return self.canary_topic
        if r < 0.65:
            return self.pick(self.fuzz_queues)
        if r < 0.80:
            return self.pick(self.fuzz_topics)
        return self.pick(self.subscribe_destinations if for_subscribe
                         else self.hostile_destinations)

    def receipt(self) -> list[tuple[bytes, bytes]]:
        if self.chance(0.6):
            return [(b"receipt", self.uid(b"c"))]
        if self.chance(0.1):
            return [(b"receipt", self.hostile_string())]
        return []

    def body(self) -> tuple[bytes, list[tuple[bytes, bytes]], bool]:
        """(body, content-length header(s), terminal)."""
        r = self.rng.random()
        if r < 0.5:
            body = self.uid(b"fz-body-")
        elif r < 0.7:
            body = b""
        elif r < 0.85:
            body = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 64)))
        else:
            body = b"fz-" + b"B" * self.rng.randrange(1, 70_000)
        has_nul = b"\x00" in body
        r = self.rng.random()
        if r < 0.6 or has_nul:
            return body, [(b"content-length", b"%d" % len(body))], False
        if r < 0.85:
            return body, [], False
        if r < 0.92:  # shorter than the body: the byte after it is not NUL
            return body, [(b"content-length", b"%d" % max(0, len(body) - 1))], False
        # longer than the body, or an integer only Python's int() reads: out of sync
        return body, [(b"content-length", self.pick(HOSTILE_INTS))], True

    # -- connection -------------------------------------------------------------------
    def connect(self) -> bytes:
        """A CONNECT a real client might send, on any version (the connection must open
        for the other cases to run; hostile CONNECTs are their own case)."""
        versions = self.pick((b"1.0", b"1.1", b"1.2", b"1.0,1.1,1.2", b"1.1,1.0", b"1.2,1.1",
                              None))
        headers = [(b"host", b"localhost")]
        if versions is not None:
            headers.insert(0, (b"accept-version", versions))
        if self.chance(0.5):
            headers.append((b"heart-beat", self.pick((b"0,0", b"0,10000", b"10000,0"))))
        if self.chance(0.2):
            headers.append((b"client-id", self.uid(b"fz-client-")))
        return frame(self.pick((b"CONNECT", b"STOMP")) if versions else b"CONNECT", headers)

    def hostile_connect(self) -> Case:
        """A CONNECT with hostile headers; the connection may or may not open."""
        headers = [(b"accept-version", self.pick((b"1.2", b"1.0", b"2.0", b"", b"1.2,\xff",
                                                  b"1.1,1.2," + b"9" * 5000))),
                   (b"host", self.hostile_string())]
        if self.chance(0.5):
            headers.append((b"heart-beat", self.pick(
                (b"0,0", b"-1,0", b"1_0,0", "\u0663,0".encode(),
                 b"9" * 5000 + b",0", b"1", b",", b"a,b", b"0,9223372036854775808"))))
        if self.chance(0.5):
            headers.append((b"client-id", self.hostile_string()))
        if self.chance(0.3):
            headers.append((b"login", self.hostile_string()))
        return Case("connect", frame(b"CONNECT", headers))

    # -- cases ------------------------------------------------------------------------
    def case(self, st: ConnState) -> Case:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        return getattr(self, "_" + kind.replace("-", "_"))(st)

    def batch(self, st: ConnState, size: int) -> list[Case]:
        """`size` cases; a terminal case ends the batch (nothing after it would be read)."""
        cases: list[Case] = []
        for _ in range(size):
            c = self.case(st)
            cases.append(c)
            if c.terminal:
                break
        return cases

    def _send_headers(self, st: ConnState) -> list[tuple[bytes, bytes]]:
        h = [(b"destination", self.destination())]
        if self.chance(0.5):
            h.append((b"persistent", self.pick((b"true", b"false", b"TRUE", b"", b"\xff"))))
        if self.chance(0.3):
            h.append((b"amqlite.producerId", self.uid(b"fz-p")))
            h.append((b"amqlite.producerSeq", b"%d" % self.rng.randrange(1, 1000)))
        if st.txs and self.chance(0.2):
            h.append((b"transaction", self.pick(st.txs)))
        return h + self.receipt()

    def _send(self, st: ConnState, extra: list[tuple[bytes, bytes]],
              headers: list[tuple[bytes, bytes]] | None = None) -> Case:
        body, cl, terminal = self.body()
        h = (headers if headers is not None else self._send_headers(st)) + extra + cl
        self.rng.shuffle(h)
        return Case("send", frame(b"SEND", h, body), terminal)

    def _send_int(self, st: ConnState) -> Case:
        name = self.pick((b"priority", b"expires", b"amqlite.producerSeq", b"priority",
                          b"expires", b"amqlite.deliveryCount"))
        extra = [(name, self.pick(HOSTILE_INTS))]
        if name == b"amqlite.producerSeq":
            extra.append((b"amqlite.producerId", self.uid(b"fz-p")))
        c = self._send(st, extra)
        c.kind = "send-int"
        return c

    def _send_string(self, st: ConnState) -> Case:
        r = self.rng.random()
        headers = self._send_headers(st)
        if r < 0.3:
            headers[0] = (b"destination", self.pick(self.hostile_destinations))
            extra: list[tuple[bytes, bytes]] = []
        elif r < 0.5:
            extra = [(b"amqlite.producerId", self.hostile_string()),
                     (b"amqlite.producerSeq", b"%d" % self.rng.randrange(1, 1000))]
        elif r < 0.8:
            extra = [(self.uid(b"h"), self.hostile_string())]
        else:
            extra = [(self.pick(HOSTILE_NAMES), self.some_value())]
        c = self._send(st, extra, headers)
        c.kind = "send-string"
        return c

    def _send_body(self, st: ConnState) -> Case:
        c = self._send(st, [])
        c.kind = "send-body"
        return c

    def _subscribe(self, st: ConnState) -> Case:
        sub_id = self.uid(b"s") if self.chance(0.8) else self.hostile_string()
        dest = self.destination(for_subscribe=True)
        h = [(b"destination", dest), (b"id", sub_id)]
        if self.chance(0.7):
            h.append((b"ack", self.pick(ACK_MODES) if self.chance(0.3) else
                      self.pick((b"auto", b"client", b"client-individual"))))
        if self.chance(0.3):
            h.append((b"activemq.prefetchSize", self.pick(HOSTILE_INTS)))
        if dest.startswith(b"/topic/") and self.chance(0.3):
            h.append((self.pick((b"activemq.subscriptionName", b"durable-subscription-name")),
                      self.some_value()))
        if self.chance(0.15):
            h.append((b"selector", self.hostile_string()))
        if self.chance(0.1):
            del h[self.rng.randrange(len(h))]
        st.subs.append((sub_id, dest))
        return Case("subscribe", frame(b"SUBSCRIBE", h + self.receipt()))

    def _unsubscribe(self, st: ConnState) -> Case:
        if st.subs and self.chance(0.7):
            sub_id, dest = st.subs.pop(self.rng.randrange(len(st.subs)))
        else:
            sub_id, dest = self.some_value(), self.destination(for_subscribe=True)
        h = [(b"id", sub_id)] if self.chance(0.8) else [(b"destination", dest)]
        return Case("unsubscribe", frame(b"UNSUBSCRIBE", h + self.receipt()))

    def _ack_frame(self, st: ConnState, tx: bytes | None) -> bytes:
        command = b"ACK" if self.chance(0.75) else b"NACK"
        r = self.rng.random()
        if r < 0.6 and st.ack_ids:
            h = [(b"id", self.pick(st.ack_ids))]  # STOMP 1.2
            if st.version != "1.2" and st.message_ids:
                h = [(b"message-id", self.pick(st.message_ids))]
                if st.sub_ids_seen:
                    h.append((b"subscription", self.pick(st.sub_ids_seen)))
        elif r < 0.8:
            h = [(b"id", self.pick(HOSTILE_INTS))]
        else:
            h = [(self.pick((b"id", b"message-id")), self.hostile_string()),
                 (b"subscription", self.some_value())]
        if tx is not None:
            h.append((b"transaction", tx))
        return frame(command, h + self.receipt())

    def _ack(self, st: ConnState) -> Case:
        tx = self.pick(st.txs) if st.txs and self.chance(0.3) else None
        return Case("ack", self._ack_frame(st, tx))

    def _tx(self, st: ConnState) -> Case:
        r = self.rng.random()
        if r < 0.3 or not st.txs:
            name = self.uid(b"t") if self.chance(0.8) else self.hostile_string()
            st.txs.append(name)
            return Case("tx", frame(b"BEGIN", [(b"transaction", name), *self.receipt()]))
        tx = self.pick(st.txs)
        if r < 0.55:  # a SEND in the transaction, valid or hostile
            c = self.pick((self._send_int, self._send_string, self._send_body))(st)
            c.data = c.data.replace(b"SEND\n", b"SEND\ntransaction:" + tx + b"\n", 1)
            c.kind = "tx"
            return c
        if r < 0.75:
            return Case("tx", self._ack_frame(st, tx))
        st.txs.remove(tx)
        command = b"COMMIT" if self.chance(0.7) else b"ABORT"
        if self.chance(0.1):
            tx = self.some_value()  # unknown transaction
        return Case("tx", frame(command, [(b"transaction", tx), *self.receipt()]))

    def _headers(self, st: ConnState) -> Case:
        """Duplicated, missing, escaped headers and CRLF line ends on any command."""
        command = self.pick(CLIENT_COMMANDS[:-1])
        h: list[tuple[bytes, bytes]] = [
            (b"destination", self.destination(for_subscribe=command != b"SEND")),
            (b"id", self.uid(b"s")), (b"transaction", self.pick(st.txs) if st.txs else
                                      self.uid(b"t"))]
        if command == b"SUBSCRIBE":
            st.subs.append((h[1][1], h[0][1]))
        h += self.receipt()
        for _ in range(self.rng.randrange(1, 4)):
            r = self.rng.random()
            if r < 0.35 and h:
                h.insert(self.rng.randrange(len(h) + 1), (self.pick(h)[0], self.some_value()))
            elif r < 0.6 and h:
                del h[self.rng.randrange(len(h))]
            elif r < 0.8:
                h.append((self.pick(HOSTILE_NAMES), self.some_value()))
            else:
                h.append((self.uid(b"e") + self.pick((b"\\c", b"\\n", b"\\r", b"\\t", b"\\")),
                          self.pick((b"\\c\\n\\\\", b"\\r", b"\\x", b"a\\", b"ok"))))
        eol = b"\r\n" if self.chance(0.3) else b"\n"
        body = self.uid(b"fz-h-") if command == b"SEND" else b""
        return Case("headers", frame(command, h, body, eol))

    def _garbage(self, st: ConnState) -> Case:
        r = self.rng.random()
        if r < 0.3:
            return Case("garbage", frame(self.pick((b"GARBAGE", b"send", b"CONNECT", b"STOMP",
                                                    b"MESSAGE", b"RECEIPT", b"ERROR", b"\xff",
                                                    b"SEND ", b" SEND", b"")),
                                         [(b"destination", self.destination())]))
        if r < 0.5:  # a header line without a colon
            return Case("garbage", b"SEND\ndestination:/queue/fz-x\nno-colon-here\n\nhi\x00")
        # flip bytes in a valid frame's header block; a NUL or LF there may desync the stream
        data = bytearray(frame(b"SEND", [(b"destination", self.pick(self.fuzz_queues)),
                                         (b"custom", b"value")], b"fz-flip"))
        for _ in range(self.rng.randrange(1, 4)):
            data[self.rng.randrange(len(data) - 9)] = self.rng.randrange(256)
        return Case("garbage", bytes(data), terminal=True)

    def _cut(self, st: ConnState) -> Case:
        """A frame cut at a random byte: the client drops the connection mid-frame."""
        body, cl, _ = self.body()
        full = frame(b"SEND", [(b"destination", self.destination()), *cl], body)
        return Case("cut", full[:self.rng.randrange(1, len(full))], terminal=True)

    def _disconnect(self, st: ConnState) -> Case:
        return Case("disconnect", frame(b"DISCONNECT", self.receipt()), terminal=True)

    # -- wire -------------------------------------------------------------------------
    def join(self, cases: list[Case]) -> bytes:
        """Pipeline the cases, sometimes with heart-beat EOLs between frames."""
        parts: list[bytes] = []
        for c in cases:
            if self.chance(0.1):
                parts.append(self.pick((b"\n", b"\r\n", b"\n\n")))
            parts.append(c.data)
        return b"".join(parts)

    def chunks(self, data: bytes) -> list[bytes]:
        """Split at random byte boundaries (often whole, sometimes in many small pieces)."""
        if self.chance(0.6):
            return [data]
        out, i = [], 0
        small = self.chance(0.3)
        while i < len(data):
            n = self.rng.randrange(1, 8 if small else 4096)
            out.append(data[i:i + n])
            i += n
            if len(out) > 200:
                out.append(data[i:])
                break
        return out
