"""netlink.py — two network namespaces joined by a link whose faults a test sets: delay, loss,
and the link going down. What `tc qdisc add ... netem delay 50ms loss 1%` on a veth pair gives,
for kernels built without sch_netem (this project's CI machines: "Specified qdisc kind is
unknown"): each namespace gets a TUN device, and a forwarder in the test process moves every IP
packet from one TUN device to the other, holding it for the delay and dropping the lost ones
(a seeded random stream, so a run's losses repeat). Link down is the kernel's own: `ip link set
DEV down` on the near side, so sends fail with no route and retransmissions back off as on a
real cable pull; the forwarder also drops what is queued.

The test process itself must run in a network namespace of its own (it is "near": 10.77.0.1 on
tun-near); `enter_namespace()` re-executes the script under `unshare --user --map-root-user
--net --mount` when it is not. "far" is a second network + mount namespace held by a sleeping
child; `far_cmd(args)` runs a command there (10.77.0.2 on tun-far). Each has its own /sys (UCX
finds its tcp devices in /sys/class/net). Stdlib only.
"""
import ctypes
import fcntl
import heapq
import os
import random
import select
import struct
import subprocess
import sys
import threading
import time

NEAR_ADDR = "10.77.0.1"
FAR_ADDR = "10.77.0.2"
NEAR_DEV = "tun-near"
FAR_DEV = "tun-far"

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_CLONE_NEWNET = 0x40000000
_ENV_INNER = "PD_NETLINK_INNER"


def enter_namespace():
    """Re-executes this script in a user + network namespace of its own (root inside it, so it
    may make TUN devices and namespaces; nothing changes on the host's network). Returns when
    already inside; exits with the child's code otherwise."""
    if os.environ.get(_ENV_INNER) == "1":
        return
    env = dict(os.environ, **{_ENV_INNER: "1"})
    # --mount: sysfs mounted again in the new namespace, since /sys/class/net lists the devices
    # of the namespace that mounted it, and UCX picks its tcp devices from there
    cmd = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--kill-child", "sh",
           "-c", 'mount -t sysfs sysfs /sys && exec "$0" "$@"', sys.executable,
           os.path.abspath(sys.argv[0])] + sys.argv[1:]
    try:
        r = subprocess.run(cmd, env=env)
    except OSError as e:
        print("netlink: cannot run unshare: %r" % e, flush=True)
        sys.exit(1)
    sys.exit(r.returncode)


def _sh(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: rc %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()))


def _comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def _tun_open(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


class Link:
    """The two namespaces and the forwarder between them. delay_s, loss: set at any time (both
    directions); set_down(True/False): the link down / up. Counters: forwarded, dropped."""

    def __init__(self, seed=1):
        self.delay_s = 0.0
        self.loss = 0.0
        self.down = False
        self.forwarded = 0
        self.dropped = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = False
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self._holder = subprocess.Popen(["unshare", "--net", "--mount", "sh", "-c",
                                         "mount -t sysfs sysfs /sys && exec sleep 86400"])
        self.far_ns = "/proc/%d/ns/net" % self._holder.pid
        self.far_mnt = "/proc/%d/ns/mnt" % self._holder.pid
        own = os.open("/proc/self/ns/net", os.O_RDONLY)
        # the holder's namespaces are ready once sh has exec'd sleep
        deadline = time.time() + 10
        while _comm(self._holder.pid) != "sleep":
            if time.time() > deadline or self._holder.poll() is not None:
                raise RuntimeError("netlink: the far namespace did not appear")
            time.sleep(0.01)
        _sh("ip", "link", "set", "lo", "up")
        _sh(*self.far_cmd(["ip", "link", "set", "lo", "up"]))
        _sh("ip", "tuntap", "add", "dev", NEAR_DEV, "mode", "tun")
        _sh(*self.far_cmd(["ip", "tuntap", "add", "dev", FAR_DEV, "mode", "tun"]))
        self._near = _tun_open(NEAR_DEV)
        far = os.open(self.far_ns, os.O_RDONLY)
        try:
            # a TUN fd belongs to the namespace it was opened in: open it there, come back
            if libc.setns(far, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the far namespace")
            try:
                self._far = _tun_open(FAR_DEV)
            finally:
                if libc.setns(own, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back")
        finally:
            os.close(far)
            os.close(own)
        _sh("ip", "addr", "add", NEAR_ADDR + "/24", "dev", NEAR_DEV)
        _sh("ip", "link", "set", NEAR_DEV, "up")
        _sh(*self.far_cmd(["ip", "addr", "add", FAR_ADDR + "/24", "dev", FAR_DEV]))
        _sh(*self.far_cmd(["ip", "link", "set", FAR_DEV, "up"]))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def far_cmd(self, args):
        """args run in the far namespace (nsenter execs them: the PID is the command's own)."""
        return ["nsenter", "--net=" + self.far_ns, "--mount=" + self.far_mnt, "--"] + list(args)

    def set_faults(self, delay_s=0.0, loss=0.0):
        with self._lock:
            self.delay_s = delay_s
            self.loss = loss

    def set_down(self, down):
        """The near side's link down (the kernel drops its route; packets held in the forwarder
        are lost) or back up (the route returns with the link)."""
        with self._lock:
            self.down = down
        _sh("ip", "link", "set", NEAR_DEV, "down" if down else "up")

    def close(self):
        self._stop = True
        self._thread.join(5)
        self._holder.kill()
        self._holder.wait(10)

    def _run(self):
        queue = []  # (due, seq, fd to write, packet)
        seq = 0
        peer = {self._near: self._far, self._far: self._near}
        while not self._stop:
            now = time.monotonic()
            while queue and queue[0][0] <= now:
                _, _, out, pkt = heapq.heappop(queue)
                try:
                    os.write(out, pkt)
                    self.forwarded += 1
                except OSError:  # the far side's link is down or its queue full: lost
                    self.dropped += 1
            wait = 0.05 if not queue else max(0.0, min(0.05, queue[0][0] - now))
            try:
                ready, _, _ = select.select([self._near, self._far], [], [], wait)
            except InterruptedError:
                continue
            for fd in ready:
                for _ in range(256):
                    try:
                        pkt = os.read(fd, 65536)
                    except (BlockingIOError, OSError):
                        break
                    with self._lock:
                        lost = self.down or (self.loss > 0 and self._rng.random() < self.loss)
                        delay = self.delay_s
                    if lost:
                        self.dropped += 1
                        continue
                    seq += 1
                    heapq.heappush(queue, (time.monotonic() + delay, seq, peer[fd], pkt))
            if self.down and queue:
                with self._lock:
                    if self.down:
                        self.dropped += len(queue)
                        queue.clear()
