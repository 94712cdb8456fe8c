"""dns_server.py — a tiny authoritative DNS server over UDP for router discovery tests (stdlib).

Answers A and AAAA queries from a table the test changes while the server runs
(set(name, [addresses])); a name not in the table gets NXDOMAIN, a name in it with no address
of the asked family gets NOERROR with no answer (NODATA), a name marked with fail(name) gets
SERVFAIL, and one marked with silent(name) gets no answer at all (the client times out). TTL 0, so nothing between the router and here may cache. Queries are counted per
name so a test can tell that re-resolution happens. EDNS options and the additional section of
a query are ignored (answers stay far below 512 bytes).
"""
import ipaddress
import socket
import struct
import threading

NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3
T_A, T_AAAA = 1, 28


class DnsServer:
    def __init__(self, host="127.0.0.1"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.2)
        self.host, self.port = self.sock.getsockname()
        self.lock = threading.Lock()
        self.table = {}
        self.failing = set()
        self.silent_names = set()
        self.queries = {}
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def set(self, name, addrs):
        with self.lock:
            self.table[name.lower().rstrip(".")] = list(addrs)

    def remove(self, name):
        with self.lock:
            self.table.pop(name.lower().rstrip("."), None)

    def fail(self, name, on=True):
        with self.lock:
            (self.failing.add if on else self.failing.discard)(name.lower().rstrip("."))

    def silent(self, name, on=True):
        with self.lock:
            (self.silent_names.add if on else self.silent_names.discard)(name.lower().rstrip("."))

    def count(self, name):
        with self.lock:
            return self.queries.get(name.lower().rstrip("."), 0)

    def stop(self):
        self.stopping = True
        self.thread.join(5)
        self.sock.close()

    def _serve(self):
        while not self.stopping:
            try:
                data, peer = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                reply = self._answer(data)
            except (ValueError, IndexError, struct.error):
                continue  # not a query we understand: no answer, as a real server might
            if reply:
                self.sock.sendto(reply, peer)

    def _answer(self, q):
        qid, flags, qd = struct.unpack(">HHH", q[:6])
        if qd != 1 or flags & 0x8000:
            return None
        pos, labels = 12, []
        while q[pos]:
            n = q[pos]
            labels.append(q[pos + 1:pos + 1 + n].decode("ascii").lower())
            pos += 1 + n
        pos += 1
        qtype, qclass = struct.unpack(">HH", q[pos:pos + 4])
        question = q[12:pos + 4]
        name = ".".join(labels)
        with self.lock:
            self.queries[name] = self.queries.get(name, 0) + 1
            failing = name in self.failing
            addrs = self.table.get(name)
            if name in self.silent_names:
                return None
        rcode, answers = NOERROR, []
        if failing:
            rcode = SERVFAIL
        elif addrs is None:
            rcode = NXDOMAIN
        else:
            for a in addrs:
                ip = ipaddress.ip_address(a)
                if (qtype == T_A and ip.version == 4) or (qtype == T_AAAA and ip.version == 6):
                    rdata = ip.packed
                    # name: a pointer to the question's name at offset 12; class IN; TTL 0
                    answers.append(struct.pack(">HHHIH", 0xC00C, qtype, 1, 0, len(rdata)) + rdata)
        # QR, AA, RD copied from the query, RA
        rflags = 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | rcode
        head = struct.pack(">HHHHHH", qid, rflags, 1, len(answers), 0, 0)
        return head + question + b"".join(answers)
