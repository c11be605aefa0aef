"""A fixed delay on a link without tc netem (``python -m tools.chaos_hosts delay``): the
packets an iptables ``NFQUEUE`` rule hands to this process are let go ``ms``
milliseconds after they arrive, in order, with one batch verdict for all that are due.

Run inside the host's namespace (netlink sockets belong to one). It speaks the
nfnetlink_queue protocol directly (no libnetfilter_queue), copies no payload (only the
packet ids), and on SIGTERM lets everything it holds go at once and exits. The rule
carries ``--queue-bypass``, so with this process gone packets pass undelayed.
"""

from __future__ import annotations

import errno
import select
import signal
import socket
import struct
import sys
import time
from collections import deque

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_ACCEPT = 1


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(kind: int, queue: int, attrs: bytes, flags: int, seq: int) -> bytes:
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack(">H", queue) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags,
                       seq, 0) + body


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    while len(data) >= 16:
        length, kind = struct.unpack_from("=IH", data)
        if length < 16:
            break
        out.append((kind, data[16:length]))
        data = data[(length + 3) & ~3:]
    return out


def _packet_id(body: bytes) -> int | None:
    attrs = body[4:]  # after nfgenmsg
    while len(attrs) >= 4:
        length, kind = struct.unpack_from("=HH", attrs)
        if length < 4:
            return None
        if kind & 0x7FFF == NFQA_PACKET_HDR:
            return int(struct.unpack_from(">I", attrs, 4)[0])
        attrs = attrs[(length + 3) & ~3:]
    return None


class Delayer:
    def __init__(self, queue: int, delay_s: float) -> None:
        self.queue = queue
        self.delay = delay_s
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self.seq = 0
        self.held: deque[tuple[float, int]] = deque()

    def _config(self, attrs: bytes) -> None:
        self.seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attrs,
                                NLM_F_REQUEST | NLM_F_ACK, self.seq))
        for kind, body in _messages(self.sock.recv(65536)):
            if kind == NLMSG_ERROR:
                code = struct.unpack_from("=i", body)[0]
                if code != 0:
                    raise OSError(-code, f"nfnetlink_queue config: {errno.errorcode.get(-code)}")

    def bind(self) -> None:
        self._config(_attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_BIND,
                                                     socket.AF_INET)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)))
        self._config(_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", 1 << 16)))

    def release(self, up_to: int) -> None:
        """Accept every held packet whose id is at most ``up_to``."""
        self.seq += 1
        self.sock.send(_message(NFQNL_MSG_VERDICT_BATCH, self.queue,
                                _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, up_to)),
                                NLM_F_REQUEST, self.seq))

    def serve(self, stop: list[bool]) -> None:
        while not stop[0]:
            now = time.monotonic()
            wait = max(self.held[0][0] - now, 0.0) if self.held else 0.2
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                try:
                    data = self.sock.recv(1 << 20)
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS:
                        raise
                    data = b""
                now = time.monotonic()
                for kind, body in _messages(data):
                    if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                        pid = _packet_id(body)
                        if pid is not None:
                            self.held.append((now + self.delay, pid))
            now = time.monotonic()
            due = None
            while self.held and self.held[0][0] <= now:
                due = self.held.popleft()[1]
            if due is not None:
                self.release(due)
        if self.held:
            self.release(self.held[-1][1])


def main(queue: int, delay_ms: float) -> int:
    stop = [False]

    def on_term(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    delayer = Delayer(queue, delay_ms / 1000)
    delayer.bind()
    print(f"bound queue {queue}, delay {delay_ms:g} ms", flush=True)
    delayer.serve(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2])))
