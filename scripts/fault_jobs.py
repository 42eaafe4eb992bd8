"""The rendezvous mode's job-identity cases (see fault_harness.py): two jobs on one port, and a
squatter on MASTER_PORT.

``two-jobs``
    Two jobs of N PEs with identical environments (RANK/WORLD_SIZE/MASTER_* as ``pe_env`` sets
    them, no ``SYMHEAP_TOKEN``, one user secret file, children of this one process): every PE of
    both started at the same moment, in a random order. Each PE all-gathers its job's tag
    (``HARNESS_JOB``, which symheap does not read). A trial is *mixed* if any PE got another
    job's tag. A PE that fails must say why: its message names the two jobs sharing the
    rendezvous.

``squatter``
    A process that is not the job (standing for another user's) listens on ``MASTER_PORT`` before
    PE 0 and answers every connection with a forged Welcome or a forged Challenge, recording
    every byte it receives. The job has ``SYMHEAP_TOKEN``, or none (a job across nodes: its token
    is derived from the user secret file). No recorded byte may hold the token (or the secret),
    no PE may send anything after the forged answer, and every PE must fail at once saying
    that what answers is not its PE 0. Variant ``joiner``: a job across nodes without
    ``SYMHEAP_TOKEN`` while a stranger presents the token derived from public job details (all
    that another user can compute): it must be refused and the job run.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import fault_harness as fh

# What a PE that met a second job says (crates/symheap/src/bootstrap/accept.rs).
TWO_JOBS = "two jobs share the rendezvous"
# What a PE says of a squatter: PE 0 finds the port held, the others find no proof there.
SQUATTED = ("another process holds it", "not this job's PE 0", "did not prove it holds this job's token")


@dataclass
class PeOutcome:
    job: str
    rank: int
    rc: Optional[int]
    got: Optional[List[str]] = None
    secs: Optional[float] = None
    error: str = ""


def outcome(job: str, r: fh.PeResult) -> PeOutcome:
    o = PeOutcome(job, r.rank, r.rc)
    for line in r.stdout.splitlines():
        if line.startswith("GOT "):
            o.got = line[4:].split(",")
        elif line.startswith("ERROR "):
            _, secs, kind, msg = line.split(" ", 3)
            o.secs, o.error = float(secs), f"{kind}: {msg}"
    if o.got is None and not o.error:
        tail = (r.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        o.error = f"exit {r.rc}: {tail}"
    return o


@dataclass
class JobsTrial:
    transport: str
    n: int
    pes: List[PeOutcome] = field(default_factory=list)

    @property
    def mixed(self) -> bool:
        return any(p.got is not None and any(t != p.job for t in p.got) for p in self.pes)


def secret_file() -> str:
    """A user secret file for the jobs across nodes without SYMHEAP_TOKEN (made by the first PE)."""
    d = tempfile.mkdtemp(prefix="symheap-harness-")
    return os.path.join(d, "secret")


def two_jobs_trial(n: int, one_node: bool, timeout: float, secret: str) -> JobsTrial:
    port = fh.free_port()
    jobs = {}
    for tag in ("A", "B"):
        env = {"SYMHEAP_SECRET_FILE": secret, "HARNESS_JOB": tag}
        jobs[tag] = fh.Job(fh.JobSpec(n=n, port=port, timeout=timeout, one_node=one_node, extra_env=env), ["tag"])
    order = [(tag, r) for tag in jobs for r in range(n)]
    random.shuffle(order)
    for tag, r in order:
        jobs[tag].start([r])
    t = JobsTrial("unix" if one_node else "tcp", n)
    for tag, job in jobs.items():
        t.pes += [outcome(tag, r) for r in job.wait(timeout + 30)]
    return t


def two_jobs_table(trials: List[JobsTrial]) -> Tuple[str, List[str]]:
    rows = [
        "| case | transport | PEs per job | trials | mixed trials | PEs with their own job's data "
        "| PEs failed naming the two jobs | PEs failed otherwise | hung | max s to fail |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    problems = []
    for tr, n in sorted({(t.transport, t.n) for t in trials}):
        ts = [t for t in trials if (t.transport, t.n) == (tr, n)]
        pes = [p for t in ts for p in t.pes]
        own = [p for p in pes if p.got is not None and all(x == p.job for x in p.got)]
        clear = [p for p in pes if p.got is None and TWO_JOBS in p.error]
        hung = [p for p in pes if p.rc is None]
        other = [p for p in pes if p.got is None and TWO_JOBS not in p.error and p.rc is not None]
        secs = [p.secs for p in pes if p.secs is not None and p.got is None]
        mixed = sum(t.mixed for t in ts)
        rows.append(
            f"| two-jobs | {tr} | {n} | {len(ts)} | {mixed} | {len(own)} | {len(clear)} | {len(other)} "
            f"| {len(hung)} | {max(secs) if secs else 0:.2f} |"
        )
        for t in ts:
            for p in t.pes:
                if p.got is not None and any(x != p.job for x in p.got):
                    problems.append(f"{tr} {n}: job {p.job}'s PE {p.rank} got {p.got}")
        problems += [f"{tr} {n}: job {p.job}'s PE {p.rank}: {p.error[:300]}" for p in other[:3] + hung[:3]]
    return "\n".join(rows), problems


def run_two_jobs(args: argparse.Namespace) -> int:
    transports = ["tcp", "unix"] if args.transport == "both" else [args.transport]
    secret = secret_file()
    trials = []
    for n in [int(p) for p in args.pes.split(",")]:
        for transport in transports:
            for _ in range(args.trials):
                trials.append(two_jobs_trial(n, transport == "unix", args.timeout, secret))
    text, problems = two_jobs_table(trials)
    print(text)
    for p in problems:
        print(f"FAIL two-jobs {p}", file=sys.stderr)
    return 1 if problems else 0


# ---- the squatter ------------------------------------------------------------------------------


class Squatter(threading.Thread):
    """Listens on the job's port before PE 0; answers each connection's first frame with a forged
    Welcome or a forged Challenge (in turn) and records every byte received, and how many came
    after the forged answer."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.stop = threading.Event()
        self.received = bytearray()
        self.after = 0
        self.conns = 0
        self.lock = threading.Lock()
        self.handlers: List[threading.Thread] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            h = threading.Thread(target=self.serve, args=(c, self.conns), daemon=True)
            self.conns += 1
            h.start()
            self.handlers.append(h)
        self.sock.close()

    def _read(self, c: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = c.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return buf

    def serve(self, c: socket.socket, i: int) -> None:
        with c:
            c.settimeout(3)
            try:
                head = self._read(c, fh.HEADER_LEN)
                body = self._read(c, int.from_bytes(head[8:12], "little")) if len(head) == fh.HEADER_LEN else b""
                with self.lock:
                    self.received += head + body
                if i % 2 == 0:
                    c.sendall(fh.frame(fh.K_WELCOME, b""))
                else:
                    mac = fh._field(secrets.token_bytes(32)) + fh._field(secrets.token_bytes(32))
                    c.sendall(fh.frame(fh.K_CHALLENGE, mac))
                while True:
                    chunk = c.recv(4096)
                    if not chunk:
                        return
                    with self.lock:
                        self.received += chunk
                        self.after += len(chunk)
            except OSError:
                return


@dataclass
class SquatTrial:
    variant: str
    n: int
    learned: int = 0
    after: int = 0
    joined: int = 0
    clean: int = 0
    clear: int = 0
    failed: int = 0
    secs: List[float] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def squatter_trial(n: int, with_token: bool, timeout: float, secret: str) -> SquatTrial:
    port = fh.free_port()
    squatter = Squatter(port)
    squatter.start()
    token = secrets.token_hex(16) if with_token else None
    env = {"SYMHEAP_SECRET_FILE": secret, "HARNESS_JOB": "A"}
    job = fh.Job(fh.JobSpec(n=n, port=port, timeout=timeout, one_node=False, token=token, extra_env=env), ["tag"])
    job.start(range(n))
    results = [outcome("A", r) for r in job.wait(timeout + 20)]
    squatter.stop.set()
    squatter.join(5)
    for h in squatter.handlers:
        h.join(5)
    t = SquatTrial("SYMHEAP_TOKEN" if with_token else "no token (secret file)", n, after=squatter.after)
    secrets_held = [open(secret, "rb").read().strip()] if os.path.exists(secret) else []
    if with_token:
        secrets_held.append(token.encode())
    elif os.path.exists(secret):
        raw = fh.secret_token(secret, n, port)
        secrets_held += [raw, raw.hex().encode()]
    else:
        # No secret file was made: the PEs derived their token from public details alone.
        secrets_held.append(fh.identity(n, port))
    t.learned = sum(1 for s in secrets_held if s and s in bytes(squatter.received))
    for p in results:
        if p.got is not None:
            t.joined += 1
            t.problems.append(f"PE {p.rank} ran a job with the squatter: {p.got}")
            continue
        t.failed += 1
        if p.secs is not None:
            t.secs.append(p.secs)
        if any(s in p.error for s in SQUATTED) and p.secs is not None and p.secs < timeout:
            t.clear += 1
        else:
            t.problems.append(f"PE {p.rank}: {p.error[:300]}")
    if t.learned:
        t.problems.append(f"the squatter received {t.learned} of the job's secrets")
    if t.after:
        t.problems.append(f"PEs sent the squatter {t.after} bytes after its forged answer")
    return t


def joiner_trial(n: int, timeout: float, secret: str) -> SquatTrial:
    """A job across nodes without SYMHEAP_TOKEN; a stranger presents the publicly derived token
    as PE 1 (before the real PE 1 starts), then as a forger answering the challenge."""
    spec = fh.JobSpec(n=n, port=fh.free_port(), timeout=timeout, one_node=False)
    spec.extra_env.update(SYMHEAP_SECRET_FILE=secret, HARNESS_JOB="A")
    job = fh.Job(spec, ["tag"])
    job.start([0])
    deadline = time.monotonic() + timeout
    while not fh.listening(spec) and time.monotonic() < deadline:
        time.sleep(0.005)
    stop = threading.Event()
    public = fh.derived_token(n, spec.port)
    joiner = fh.Stranger("derived-token", ("127.0.0.1", spec.port), stop, fh.hello(public, 1, n), 1.0)
    joiner.start()
    joiner.join(5)
    job.start(range(1, n))
    results = [outcome("A", r) for r in job.wait(timeout + 20)]
    stop.set()
    t = SquatTrial("joiner with the public token", n)
    if joiner.outcome.result not in ("rejected", "closed"):
        t.joined += 1
        t.problems.append(f"the joiner's connection ended {joiner.outcome.result}")
    for p in results:
        t.clean += p.got == ["A"] * n
        if p.got != ["A"] * n:
            t.problems.append(f"PE {p.rank} of the job did not finish cleanly: {p.got} {p.error[:300]}")
    return t


def run_squatter(args: argparse.Namespace) -> int:
    secret = secret_file()
    trials: List[SquatTrial] = []
    for n in [int(p) for p in args.pes.split(",")]:
        for _ in range(args.trials):
            trials.append(squatter_trial(n, True, args.timeout, secret))
            trials.append(squatter_trial(n, False, args.timeout, secret))
            trials.append(joiner_trial(n, args.timeout, secret))
    print(
        "| case | variant (tcp) | PEs | trials | secrets the stranger received | bytes sent after its "
        "forged answer | PEs (or strangers) that joined | job PEs with their own data "
        "| PEs failed at once naming it | max s to fail |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for variant, n in sorted({(t.variant, t.n) for t in trials}):
        ts = [t for t in trials if (t.variant, t.n) == (variant, n)]
        secs = [s for t in ts for s in t.secs]
        print(
            f"| squatter | {variant} | {n} | {len(ts)} | {sum(t.learned for t in ts)} | {sum(t.after for t in ts)} "
            f"| {sum(t.joined for t in ts)} | {sum(t.clean for t in ts)} "
            f"| {sum(t.clear for t in ts)} of {sum(t.failed for t in ts)} "
            f"| {max(secs) if secs else 0:.2f} |"
        )
    for t in trials:
        for p in t.problems:
            print(f"FAIL squatter {t.variant} {t.n} PEs: {p}", file=sys.stderr)
    return 1 if any(t.problems for t in trials) else 0
