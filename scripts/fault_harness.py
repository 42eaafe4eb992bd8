#!/usr/bin/env python3
"""Fault harness: symheap jobs started by hand (no launcher), attacked while they run.

Modes (subcommands):

``rendezvous``
    While a job of N PEs starts, strangers hit PE 0's rendezvous: idle connections (more of them
    than PE 0 lets wait at once), one dripping a Hello a byte at a time, garbage, a Hello with a
    wrong token, one with the token a job without ``SYMHEAP_TOKEN`` would derive from public details
    and a forger (it names the job's public fingerprint, then answers PE 0's challenge with a
    made-up proof). Both
    transports are attacked: ``tcp`` (the launcher does not say the PEs share a node, the job
    has a secret token) and ``unix`` (``LOCAL_WORLD_SIZE == WORLD_SIZE``: the rendezvous is a Unix
    socket in the 0700 runtime directory, no secret token; the derived-token stranger tries TCP,
    where nothing may listen). Each trial checks that every PE started within the job's timeout,
    that no stranger was welcomed, and that PE 0 logged every stranger that reached it. Prints a
    markdown table; the exit status is 1 if any check failed.

``kill``
    Jobs of N PEs started by hand, one PE killed with SIGKILL at a random moment of a phase:
    ``init`` (while the PEs start), ``alloc`` (allocating and freeing), ``grow`` (allocations
    that grow the heap), ``barrier``, ``collective`` (all_reduce), ``signal`` (the others wait
    for a signal from the victim) and, on the CUDA backend, ``graph`` (replaying a CUDA graph of
    all_reduce). ``SYMHEAP_TIMEOUT`` stays at its default (120 s), so a survivor that does not
    fail within seconds is a hang. Counts hangs, survivors whose error does not name the dead PE
    (or is not a ``SymheapPeerError``), and the time from the kill to each survivor's error;
    counts errors that name a call the phase's loop did not make (a helper's name instead of
    the user's call); prints a markdown table per phase. The exit status is 1 if a hang, an
    unnamed death or a wrong call happened, or the slowest survivor took over ``--limit`` seconds (default 2).

``pe``
    One PE of a job (what the modes start): ``init`` (``symheap.init()``, an all_gather,
    ``finalize()``, printing ``PE-READY <rank> <init seconds>``) or ``work PHASE`` (the kill
    mode's loops, printing ``WORKING`` once in the loop and ``ERROR <time> <kind> <message>``
    when symheap raises).

The PEs get RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (and LOCAL_WORLD_SIZE for
the one-node transport) from :func:`pe_env`; :class:`Job` starts and collects them. A mode that
kills PEs at random points reuses both (add a subparser and a ``pe`` scenario).

The ``rendezvous`` mode's ``--cases`` also run, from ``fault_jobs.py``: ``two-jobs`` (two jobs with
identical environments, no ``SYMHEAP_TOKEN``, started at the same moment on one port: never mixed,
every PE that fails says why) and ``squatter`` (a process that is not the job listening on
``MASTER_PORT`` before PE 0: it learns no token, and no PE sends it anything after its forged
answer; and a stranger presenting the publicly derived token to a job across nodes without
``SYMHEAP_TOKEN`` is refused).

Example: ``python scripts/fault_harness.py rendezvous --pes 2,4,8 --trials 3``
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import random
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

# ---- what symheap's bootstrap speaks (crates/symheap/src/bootstrap/wire.rs) -----------------

WIRE_VERSION = 3
K_HELLO, K_WELCOME, K_REJECT = 1, 2, 3
K_CHALLENGE, K_PROOF = 8, 9
HEADER_LEN = 12


def frame(kind: int, payload: bytes) -> bytes:
    """A bootstrap frame: magic, version, kind, reserved, length, payload."""
    return b"SYMH" + struct.pack("<HBBI", WIRE_VERSION, kind, 0, len(payload)) + payload


def _field(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def fingerprint(token: bytes) -> str:
    """A job's public identity: what a PE's Hello names (crates/symheap/src/bootstrap/auth.rs)."""
    return hashlib.sha256(b"symheap job fingerprint\0" + token).digest()[:8].hex()


def hello(token: bytes, rank: int, world: int) -> bytes:
    """The first message a PE sends to PE 0: rank, world, a nonce, the job's fingerprint and where
    its token comes from (nothing secret, nothing about the PE: the token never goes on the wire)."""
    payload = struct.pack("<II", rank, world) + _field(secrets.token_bytes(32))
    payload += _field(fingerprint(token).encode()) + _field(b"SYMHEAP_TOKEN")
    return frame(K_HELLO, payload)


def proof(mac: bytes) -> bytes:
    """A PE's answer to PE 0's challenge: its MAC, then its pid, host name and conflict (none)."""
    return frame(K_PROOF, _field(mac) + struct.pack("<I", os.getpid()) + _field(b"harness") + _field(b""))


def identity(world: int, port: int, addr: str = "127.0.0.1") -> bytes:
    """The public identity of a job started by hand (RANK/WORLD_SIZE, no SYMHEAP_TOKEN)."""
    return f"symheap-job:RANK/WORLD_SIZE environment::{addr}:{port}:{world}".encode()


def derived_token(world: int, port: int, addr: str = "127.0.0.1") -> bytes:
    """The token of such a job on one node: its identity (the rendezvous is a Unix socket only
    this user reaches). Across nodes the token is an HMAC of the user's secret file and the
    identity (:func:`secret_token`), which another user cannot compute."""
    return identity(world, port, addr)


def secret_token(secret_file: str, world: int, port: int) -> bytes:
    """The token a job across nodes without SYMHEAP_TOKEN derives from the user secret file."""
    with open(secret_file, "rb") as f:
        key = f.read().strip()
    return hmac.new(key, b"symheap job token\0" + identity(world, port), hashlib.sha256).digest()


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def runtime_dir() -> str:
    """The directory of node-local sockets, as symheap computes it."""
    if os.environ.get("SYMHEAP_RUNTIME_DIR"):
        return os.environ["SYMHEAP_RUNTIME_DIR"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "symheap")
    return f"/tmp/symheap-{os.getuid()}"


def rendezvous_socket(token: bytes) -> str:
    """The Unix socket of a one-node job with this token."""
    return os.path.join(runtime_dir(), f"rdv-{fnv1a(token):016x}.sock")


def listening(spec: "JobSpec") -> bool:
    """Whether PE 0 of ``spec`` listens yet, found without connecting (which PE 0 would log)."""
    if spec.one_node:
        token = spec.token.encode() if spec.token is not None else derived_token(spec.n, spec.port)
        return os.path.exists(rendezvous_socket(token))
    want = f":{spec.port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[1].endswith(want) and fields[3] == "0A":
                return True
    return False


def free_port() -> int:
    """A TCP port below Linux's ephemeral range that was free a moment ago."""
    for _ in range(200):
        port = 20000 + secrets.randbelow(12000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port found")


# ---- PEs started by hand ---------------------------------------------------------------------

# Variables a launcher sets; a job started here must not inherit any from outside.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SYMHEAP_TOKEN",
    "SYMHEAP_LAUNCHER",
    "SYMHEAP_BOOTSTRAP_PORT",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
)


@dataclass
class JobSpec:
    """One job: ``n`` PEs on ``port``; ``one_node`` says LOCAL_WORLD_SIZE == WORLD_SIZE."""

    n: int
    port: int
    timeout: float
    one_node: bool
    token: Optional[str] = None  # SYMHEAP_TOKEN, None: derived
    extra_env: Dict[str, str] = field(default_factory=dict)


def pe_env(spec: JobSpec, rank: int) -> Dict[str, str]:
    """The environment of PE ``rank``, as a launcher would set it (minus a launcher)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(spec.n),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec.port),
        SYMHEAP_BACKEND="host",
        SYMHEAP_TIMEOUT=str(spec.timeout),
        SYMHEAP_HEAP_CAPACITY="256M",
        SYMHEAP_LOG="warn",
    )
    if spec.one_node:
        env["LOCAL_WORLD_SIZE"] = str(spec.n)
    if spec.token is not None:
        env["SYMHEAP_TOKEN"] = spec.token
    env.update(spec.extra_env)
    return env


@dataclass
class PeResult:
    rank: int
    rc: Optional[int]
    stdout: str
    stderr: str

    @property
    def init_s(self) -> Optional[float]:
        for line in self.stdout.splitlines():
            f = line.split()
            if len(f) == 3 and f[0] == "PE-READY" and f[1] == str(self.rank):
                return float(f[2])
        return None


class Job:
    """The PEs of one job, each a process running this script's ``pe`` subcommand."""

    def __init__(self, spec: JobSpec, scenario: Sequence[str] = ()) -> None:
        self.spec = spec
        self.scenario = list(scenario)
        self.procs: Dict[int, subprocess.Popen] = {}

    def start(self, ranks: Sequence[int]) -> None:
        for r in ranks:
            cmd = [sys.executable, os.path.abspath(__file__), "pe", *self.scenario]
            self.procs[r] = subprocess.Popen(
                cmd,
                env=pe_env(self.spec, r),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

    def wait(self, limit: float) -> List[PeResult]:
        """Waits up to ``limit`` seconds for every PE; kills the ones still running."""
        deadline = time.monotonic() + limit
        out = []
        for r in sorted(self.procs):
            p = self.procs[r]
            try:
                so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                so, se = p.communicate()
                out.append(PeResult(r, None, so, se))
                continue
            out.append(PeResult(r, p.returncode, so, se))
        return out


def run_pe(args: argparse.Namespace) -> int:
    """The ``pe`` subcommand: one PE of a job. Scenario ``init``: init, an all_gather,
    finalize. Scenario ``work PHASE``: the kill mode's loop for PHASE (see :func:`work`)."""
    if args.scenario == "work":
        return work(args.phase)
    if args.scenario == "tag":
        return tagged()
    import symheap

    rank = int(os.environ["RANK"])
    t0 = time.monotonic()
    symheap.init()
    took = time.monotonic() - t0
    got = symheap.all_gather_object_bytes(bytes([rank]))
    if got != [bytes([r]) for r in range(symheap.n_pes())]:
        print(f"PE {rank}: all_gather returned {got}", file=sys.stderr)
        return 1
    print(f"PE-READY {rank} {took:.3f}", flush=True)
    symheap.finalize()
    return 0


def tagged() -> int:
    """Scenario ``tag``: init, an all_gather of this PE's job tag (``HARNESS_JOB``, which symheap
    does not read), finalize; prints ``GOT <tags>`` and exits 0, as a program would that cannot
    tell it met another job's PEs, or ``ERROR <seconds> <class> <message>`` and exits 3."""
    import symheap

    t0 = time.monotonic()
    try:
        symheap.init()
        got = symheap.all_gather_object_bytes(os.environ["HARNESS_JOB"].encode())
        print("GOT " + ",".join(g.decode() for g in got), flush=True)
        symheap.finalize()
    except symheap.SymheapError as e:
        msg = " ".join(str(e).split())
        print(f"ERROR {time.monotonic() - t0:.3f} {type(e).__name__} {msg}", flush=True)
        os._exit(3)
    return 0


# ---- strangers -------------------------------------------------------------------------------

Target = Union[Tuple[str, int], str]  # (host, port) or a Unix socket path


@dataclass
class Outcome:
    kind: str
    target: str
    connected: bool = False
    local: Optional[str] = None  # the stranger's own address, as PE 0 logs it (TCP)
    result: str = "never connected"  # welcomed, rejected, closed, open at the end


def _read_reply(s: socket.socket) -> str:
    """What PE 0 answered: welcomed, rejected or closed (b"" or an error)."""
    buf = b""
    while len(buf) < HEADER_LEN:
        chunk = s.recv(HEADER_LEN - len(buf))
        if not chunk:
            return "closed"
        buf += chunk
    if buf[:4] != b"SYMH":
        return "closed"
    _last_header[s.fileno()] = buf
    return {K_WELCOME: "welcomed", K_REJECT: "rejected", K_CHALLENGE: "challenged"}.get(buf[6], "closed")


_last_header: Dict[int, bytes] = {}


def _skip_payload_after_header(s: socket.socket) -> None:
    """Reads the payload of the frame whose header :func:`_read_reply` just read."""
    (n,) = struct.unpack("<I", _last_header.pop(s.fileno(), b"\0" * 12)[8:12])
    while n > 0:
        chunk = s.recv(min(n, 4096))
        if not chunk:
            return
        n -= len(chunk)


class Stranger(threading.Thread):
    """One attacking connection of ``kind``: idle, drip, garbage, wrong-token, derived-token,
    forger (names the job's public fingerprint, answers PE 0's challenge with a made-up proof)."""

    def __init__(self, kind: str, target: Target, stop: threading.Event, payload: bytes, drip_s: float) -> None:
        super().__init__(daemon=True)
        self.kind, self.target, self.stop, self.payload, self.drip_s = kind, target, stop, payload, drip_s
        shown = self.target if isinstance(self.target, str) else f"{self.target[0]}:{self.target[1]}"
        self.outcome = Outcome(kind, shown)

    def _connect(self) -> Optional[socket.socket]:
        while not self.stop.is_set():
            fam = socket.AF_UNIX if isinstance(self.target, str) else socket.AF_INET
            s = socket.socket(fam, socket.SOCK_STREAM)
            try:
                s.connect(self.target)
            except OSError:
                s.close()
                time.sleep(0.005)
                continue
            return s
        return None

    def run(self) -> None:
        s = self._connect()
        if s is None:
            return
        o = self.outcome
        o.connected = True
        if not isinstance(self.target, str):
            o.local = "{}:{}".format(*s.getsockname())
        try:
            with s:
                o.result = self._attack(s)
        except OSError:
            o.result = "closed"

    def _attack(self, s: socket.socket) -> str:
        if self.kind == "drip":
            for b in self.payload:
                s.settimeout(self.drip_s)
                try:
                    if s.recv(1) == b"":
                        return "closed"
                except socket.timeout:
                    pass
                if self.stop.is_set():
                    return "open at the end"
                s.sendall(bytes([b]))
        elif self.payload:
            s.sendall(self.payload)
        s.settimeout(0.2)
        while not self.stop.is_set():
            try:
                got = _read_reply(s)
            except socket.timeout:
                continue
            if got != "challenged" or self.kind != "forger":
                return got
            s.settimeout(5)
            _skip_payload_after_header(s)
            s.sendall(proof(secrets.token_bytes(32)))
            s.settimeout(0.2)
        return "open at the end"


def strangers_for(spec: JobSpec, idle: int, drip_s: float, stop: threading.Event) -> List[Stranger]:
    """The attack on ``spec``'s rendezvous (see the module documentation)."""
    tcp: Target = ("127.0.0.1", spec.port)
    token = spec.token.encode() if spec.token is not None else derived_token(spec.n, spec.port)
    main: Target = rendezvous_socket(token) if spec.one_node else tcp
    wrong = hello(secrets.token_hex(16).encode(), 1, spec.n)
    derived = hello(derived_token(spec.n, spec.port), 1, spec.n)
    forged = hello(token, 2 % spec.n, spec.n)
    garbage = b"GET / HTTP/1.1\r\nHost: symheap\r\n\r\n" + secrets.token_bytes(64)
    drip = hello(secrets.token_hex(16).encode(), 1, spec.n)
    out = [Stranger("idle", main, stop, b"", drip_s) for _ in range(idle)]
    out += [
        Stranger("drip", main, stop, drip, drip_s),
        Stranger("garbage", main, stop, garbage, drip_s),
        Stranger("wrong-token", main, stop, wrong, drip_s),
        Stranger("forger", main, stop, forged, drip_s),
        # Over the Unix socket a stranger of this user with the derived token would be a PE (the
        # user can ptrace the job anyway); what must hold is that nothing listens on TCP.
        Stranger("derived-token", tcp, stop, derived, drip_s),
    ]
    return out


# ---- the rendezvous mode ---------------------------------------------------------------------


@dataclass
class Trial:
    transport: str
    n: int
    started: bool
    init_s: float
    join_s: float
    strangers: int
    refused: int
    logged: int
    reached: int
    problems: List[str]


def refusal_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if "rendezvous: refused a connection from" in line]


def rendezvous_trial(n: int, one_node: bool, timeout: float, idle: int, drip_s: float) -> Trial:
    spec = JobSpec(n=n, port=free_port(), timeout=timeout, one_node=one_node)
    if not one_node:
        spec.token = secrets.token_hex(16)
    stop = threading.Event()
    strangers = strangers_for(spec, idle, drip_s, stop)
    job = Job(spec)
    t0 = time.monotonic()
    job.start([0])
    while not listening(spec) and time.monotonic() < t0 + timeout and job.procs[0].poll() is None:
        time.sleep(0.005)
    for s in strangers:
        s.start()
    # The strangers get to PE 0 before the PEs do.
    ready_by = time.monotonic() + 3
    waiting = [s for s in strangers if s.kind != "derived-token" or not one_node]
    while time.monotonic() < ready_by and not all(s.outcome.connected for s in waiting):
        time.sleep(0.01)
    job.start(range(1, n))
    results = job.wait(timeout + 20)
    wall = time.monotonic() - t0
    stop.set()
    for s in strangers:
        s.join(5)
    return judge(spec, results, strangers, wall)


def judge(spec: JobSpec, results: List[PeResult], strangers: List[Stranger], wall: float) -> Trial:
    problems = []
    times = [r.init_s for r in results]
    started = all(r.rc == 0 and t is not None for r, t in zip(results, times))
    for r, t in zip(results, times):
        if r.rc != 0 or t is None:
            problems.append(f"PE {r.rank} exited {r.rc}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        elif t > spec.timeout:
            problems.append(f"PE {r.rank} took {t:.2f} s to start, past the {spec.timeout} s timeout")
    pe0 = results[0].stderr if results else ""
    lines = refusal_lines(pe0)
    reached = [
        s.outcome for s in strangers if s.outcome.connected and not (s.kind == "derived-token" and spec.one_node)
    ]
    for s in strangers:
        if s.outcome.result == "welcomed":
            problems.append(f"a {s.kind} stranger at {s.outcome.target} was welcomed as a PE")
        if s.kind == "derived-token" and spec.one_node and s.outcome.connected:
            problems.append("something listens on TCP although the job meets on a Unix socket")
    if spec.one_node:
        logged = min(len(lines), len(reached))
        if len(lines) < len(reached):
            problems.append(f"PE 0 logged {len(lines)} refusals for {len(reached)} strangers that reached it")
    else:
        unlogged = [o for o in reached if not any(f"from {o.local}:" in line for line in lines)]
        logged = len(reached) - len(unlogged)
        for o in unlogged[:3]:
            problems.append(f"no warning names the {o.kind} stranger at {o.local} ({o.result})")
    refused = sum(1 for s in strangers if s.outcome.result != "welcomed")
    pe_times = [t for t in times if t is not None]
    join = [t for r, t in zip(results, times) if r.rank > 0 and t is not None]
    return Trial(
        transport="unix" if spec.one_node else "tcp",
        n=spec.n,
        started=started,
        init_s=max(pe_times) if pe_times else wall,
        join_s=max(join) if join else 0.0,
        strangers=len(strangers),
        refused=refused,
        logged=logged,
        reached=len(reached),
        problems=problems,
    )


def table(trials: List[Trial]) -> str:
    rows = [
        "| transport | PEs | trials | started | refused strangers | refusals logged by PE 0 "
        "| max init time (s) | max time for PEs 1.. to join (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(t.transport, t.n) for t in trials})
    for tr, n in keys:
        ts = [t for t in trials if (t.transport, t.n) == (tr, n)]
        rows.append(
            f"| {tr} | {n} | {len(ts)} | {sum(t.started for t in ts)} "
            f"| {sum(t.refused for t in ts)} of {sum(t.strangers for t in ts)} "
            f"| {sum(t.logged for t in ts)} of {sum(t.reached for t in ts)} "
            f"| {max(t.init_s for t in ts):.2f} | {max(t.join_s for t in ts):.2f} |"
        )
    return "\n".join(rows)


def run_rendezvous(args: argparse.Namespace) -> int:
    cases = [c for c in args.cases.split(",") if c]
    bad = 0
    if "strangers" in cases:
        bad |= run_strangers(args)
    if "two-jobs" in cases or "squatter" in cases:
        import fault_jobs

        if "two-jobs" in cases:
            bad |= fault_jobs.run_two_jobs(args)
        if "squatter" in cases:
            bad |= fault_jobs.run_squatter(args)
    return bad


def run_strangers(args: argparse.Namespace) -> int:
    pes = [int(p) for p in args.pes.split(",")]
    transports = ["tcp", "unix"] if args.transport == "both" else [args.transport]
    trials: List[Trial] = []
    for n in pes:
        for transport in transports:
            for _ in range(args.trials):
                t = rendezvous_trial(n, transport == "unix", args.timeout, args.idle, args.drip)
                trials.append(t)
                for p in t.problems:
                    print(f"FAIL {transport} {n} PEs: {p}", file=sys.stderr)
    print(table(trials))
    return 1 if any(t.problems for t in trials) else 0


# ---- kill mode ---------------------------------------------------------------------------------

PHASES = ("init", "alloc", "grow", "barrier", "collective", "signal", "graph")
# The calls each phase makes (see :func:`work`: init, the allocations and a barrier, then the
# loop): an error must name one of them, the call the user made, not a helper symheap ran inside.
SETUP_CALLS = ("init", "zeros", "barrier_all")
USER_CALLS = {
    "init": SETUP_CALLS,
    "alloc": (*SETUP_CALLS, "free"),
    "grow": SETUP_CALLS,
    "barrier": SETUP_CALLS,
    "collective": (*SETUP_CALLS, "all_reduce"),
    "signal": (*SETUP_CALLS, "put_signal", "signal_wait_until"),
    "graph": (*SETUP_CALLS, "all_reduce", "sync_stream"),
}


def work(phase: str) -> int:
    """One PE of a kill trial: does PHASE in a loop until symheap raises (a peer was killed),
    then prints ``ERROR <monotonic time> <kind> <message>`` and exits 3. The victim is killed by
    the harness somewhere in the loop (or during init for ``init``)."""
    import symheap

    try:
        symheap.init()
        cuda = symheap.backend() == "cuda"
        if cuda:
            import symheap.torch as front
            import torch

            def arr(n: int, dtype: str = "float32"):  # noqa: ANN202
                return front.zeros(n, dtype=getattr(torch, dtype))
        else:
            import numpy as np
            import symheap.numpy as front

            def arr(n: int, dtype: str = "float32"):  # noqa: ANN202
                return front.zeros(n, dtype=getattr(np, dtype))

        me, n = symheap.my_pe(), symheap.n_pes()
        x = arr(1 << 14)
        sig = arr(1, "int64")
        symheap.barrier_all()
        print("WORKING", flush=True)
        k = 0
        graph = None
        while True:
            k += 1
            if phase in ("init", "barrier"):
                symheap.barrier_all()
            elif phase == "alloc":
                y = arr(1 << (8 + k % 8))
                symheap.free(y)
                symheap.barrier_all()
            elif phase == "grow":
                y = arr((1 << 20) * (1 + k % 4))  # past the 1 MiB chunks: the heap grows
                symheap.barrier_all()
                del y
            elif phase == "collective":
                symheap.all_reduce(x)
                if cuda:
                    torch.cuda.synchronize()
            elif phase == "signal":
                # Every PE signals the previous one and waits for the next one's signal (the
                # victim's never comes): a host wait here, a wait on the stream on CUDA.
                symheap.barrier_all()
                symheap.put_signal(x, x, sig, k, (me + n - 1) % n)
                symheap.signal_wait_until(sig, "ge", k)
                if cuda:
                    torch.cuda.synchronize()
            elif phase == "graph":
                if not cuda:
                    raise SystemExit("the graph phase needs the CUDA backend")
                if graph is None:
                    s = torch.cuda.Stream()
                    with torch.cuda.stream(s):
                        symheap.all_reduce(x, stream=s)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        symheap.all_reduce(x)
                graph.replay()
                # Through symheap, so a failure raises here (a torch-only loop would replay
                # kernels that end at once on the abort word and never learn why).
                symheap.sync_stream()
    except symheap.SymheapError as e:
        print(f"ERROR {time.monotonic():.6f} {type(e).__name__} {e.call} {e}", flush=True)
        os._exit(3)


@dataclass
class KillTrial:
    phase: str
    n: int
    victim: int
    hangs: int = 0
    unnamed: int = 0
    # Errors that named the dead PE under a call the user did not make (a helper's name).
    wrong_call: int = 0
    times: List[float] = field(default_factory=list)
    # Survivors that named a victim killed before it reached the rendezvous: nothing can tell a
    # PE that never connected from a slow one, so they name it when the init timeout ends.
    never_joined: int = 0
    problems: List[str] = field(default_factory=list)


# The init timeout of the `init` phase: a victim killed before it connected is named when it
# ends (as missing from the rendezvous), which takes that long.
INIT_TIMEOUT = 3.0


def names_missing(msg: str, victim: int) -> bool:
    """Whether a timeout message names ``victim`` among the PEs that did not arrive."""
    import re

    m = re.search(r"PEs? ([0-9, ]+) did not arrive", msg)
    return m is not None and str(victim) in [x.strip() for x in m.group(1).split(",")]


def kill_trial(n: int, phase: str, backend: str, rng: "random.Random") -> KillTrial:
    """One job: start N PEs on PHASE, kill a random victim at a random moment, judge the rest."""
    import signal as _signal

    victim = rng.randrange(n)
    extra = {"SYMHEAP_BACKEND": backend, "SYMHEAP_CHUNK_SIZE": "1M", "SYMHEAP_HEAP_CAPACITY": "1G"}
    timeout = INIT_TIMEOUT if phase == "init" else 120.0
    spec = JobSpec(n, free_port(), timeout=timeout, one_node=True, token=secrets.token_hex(8), extra_env=extra)
    job = Job(spec, ["work", phase])
    job.start(range(n))
    t = KillTrial(phase, n, victim)
    # The victim dies at a random point: during init for `init`, else inside its loop.
    if phase == "init":
        time.sleep(rng.uniform(0.05, 0.4))
    else:
        deadline = time.monotonic() + 60
        p = job.procs[victim]
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line or line.strip() == "WORKING":
                break
        time.sleep(rng.uniform(0.02, 0.3))
    killed_at = time.monotonic()
    try:
        os.kill(job.procs[victim].pid, _signal.SIGKILL)
    except ProcessLookupError:
        t.problems.append(f"PE {victim} was gone before it was killed")
    for r in job.wait(limit=15.0):
        if r.rank == victim:
            continue
        if r.rc is None:
            t.hangs += 1
            t.problems.append(f"PE {r.rank} hung ({phase}, {n} PEs, victim {victim})")
            continue
        err = [ln for ln in r.stdout.splitlines() if ln.startswith("ERROR ")]
        if not err:
            t.unnamed += 1
            t.problems.append(f"PE {r.rank} ended ({r.rc}) without a symheap error: {r.stderr[-300:]}")
            continue
        _, ts, kind, call, msg = err[-1].split(" ", 4)
        if call not in USER_CALLS[phase] or f": {call}: " not in msg:
            t.wrong_call += 1
            t.problems.append(f"PE {r.rank}: the error names {call!r}, not the user's call: {msg[:300]}")
        if phase == "init" and kind == "SymheapTimeoutError" and names_missing(msg, victim):
            t.never_joined += 1
            continue
        t.times.append(max(0.0, float(ts) - killed_at))
        if kind != "SymheapPeerError" or f"PE {victim} exited" not in msg:
            t.unnamed += 1
            t.problems.append(f"PE {r.rank}: {kind} does not name PE {victim}: {msg[:300]}")
    return t


def run_kill(args: argparse.Namespace) -> int:
    import statistics

    rng = random.Random(args.seed)
    phases = [p for p in args.phases.split(",") if p]
    if args.backend != "cuda":
        phases = [p for p in phases if p != "graph"]
    trials: List[KillTrial] = []
    for n in [int(p) for p in args.pes.split(",")]:
        for phase in phases:
            for _ in range(args.trials):
                t = kill_trial(n, phase, args.backend, rng)
                trials.append(t)
                for p in t.problems:
                    print(f"FAIL {p}", file=sys.stderr)
    print(
        f"| phase | trials | hangs | deaths not named | not the user's call | median s to error "
        f"| max s to error | named as never joined (at the {INIT_TIMEOUT:.0f} s init timeout) | ({args.backend})"
    )
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for phase in phases:
        ts = [t for t in trials if t.phase == phase]
        times = [x for t in ts for x in t.times]
        worst = max([worst, *times])
        med = f"{statistics.median(times):.3f}" if times else "-"
        mx = f"{max(times):.3f}" if times else "-"
        joined = sum(t.never_joined for t in ts)
        print(
            f"| {phase} | {len(ts)} | {sum(t.hangs for t in ts)} | {sum(t.unnamed for t in ts)} "
            f"| {sum(t.wrong_call for t in ts)} | {med} | {mx} | {joined} |"
        )
    bad = any(t.hangs or t.unnamed or t.wrong_call for t in trials) or worst > args.limit
    return 1 if bad else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("rendezvous", help="attack PE 0's rendezvous while jobs start")
    r.add_argument("--pes", default="2,4,8", help="job sizes, comma separated (default 2,4,8)")
    r.add_argument("--trials", type=int, default=3, help="jobs per size and transport (default 3)")
    r.add_argument("--transport", choices=["tcp", "unix", "both"], default="both")
    r.add_argument("--timeout", type=float, default=10.0, help="SYMHEAP_TIMEOUT of the jobs (default 10)")
    r.add_argument("--idle", type=int, default=129, help="idle strangers per job (default 129)")
    r.add_argument("--drip", type=float, default=1.0, help="seconds between the dripping stranger's bytes")
    r.add_argument(
        "--cases",
        default="strangers,two-jobs,squatter",
        help="strangers (attack a starting job), two-jobs (two jobs with identical environments on "
        "one port), squatter (a process on MASTER_PORT before PE 0); comma separated, default all",
    )
    r.set_defaults(run=run_rendezvous)
    k = sub.add_parser("kill", help="kill one PE of running jobs at random points")
    k.add_argument("--pes", default="2,4,8", help="job sizes, comma separated (default 2,4,8)")
    k.add_argument("--trials", type=int, default=3, help="jobs per size and phase (default 3)")
    k.add_argument("--phases", default=",".join(PHASES), help="phases, comma separated")
    k.add_argument("--backend", choices=["host", "cuda"], default="host")
    k.add_argument("--limit", type=float, default=2.0, help="slowest acceptable kill-to-error time (s)")
    k.add_argument("--seed", type=int, default=1)
    k.set_defaults(run=run_kill)
    p = sub.add_parser("pe", help="(internal) one PE of a job")
    p.add_argument(
        "scenario", nargs="?", default="init", choices=["init", "work", "tag"], help="what the PE does (default init)"
    )
    p.add_argument("phase", nargs="?", default="barrier", choices=PHASES, help="for work: the phase")
    p.set_defaults(run=run_pe)
    args = ap.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
