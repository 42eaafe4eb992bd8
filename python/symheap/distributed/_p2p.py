"""send/recv for the symheap backend: mailboxes in symmetric memory.

Every PE owns, in one symmetric allocation made when the default group is created (collective
over the world), a slot of :data:`SLOT` bytes per sender and a signal word per sender
(``full[s]``: the last chunk sender s delivered) and per receiver (``ack[r]``: the last chunk
receiver r consumed). A message moves in chunks of at most a slot: the sender waits until the
receiver consumed its previous chunk (``ack``), then puts the chunk into its slot at the
receiver with the signal ``full`` set to the chunk's number; the receiver waits for ``full``,
copies the chunk out and sets ``ack`` at the sender. Messages between two PEs arrive in the
order they were sent (torch's and NCCL's rule; tags are not matched, as NCCL).

``isend``/``irecv`` only queue the message and move what can move without waiting; a Work's
``wait()`` moves every queued message (its own and the ones queued before it) until its own is
done, so ``batch_isend_irecv`` rings of any size complete. A wait that sees no progress for the
context's timeout raises :class:`symheap.SymheapTimeoutError` naming the peer.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional

import torch as _torch
import torch.distributed as dist

from .. import _core, _shmem
from .. import torch as st
from .._native import SymheapTimeoutError, SymheapUnsupportedError

# Bytes of one mailbox slot (per sender, on every PE): SYMHEAP_P2P_SLOT, default 256 KiB.
SLOT = int(os.environ.get("SYMHEAP_P2P_SLOT", "") or (256 << 10))


class _Msg:
    """One queued send or recv: its tensor's bytes, the peer, chunks done."""

    def __init__(self, send: bool, t: _torch.Tensor, peer: int) -> None:
        self.send = send
        self.t = t
        self.bytes = (t if t.is_contiguous() else t.contiguous()).reshape(-1).view(_torch.uint8)
        if not send and not t.is_contiguous():
            self.bytes = _torch.empty(t.numel() * t.element_size(), dtype=_torch.uint8, device=t.device)
        self.peer = peer
        self.chunks = max(1, -(-self.bytes.numel() // SLOT))
        self.done_chunks = 0

    @property
    def done(self) -> bool:
        return self.done_chunks == self.chunks


class _Engine:
    """This PE's mailboxes and queued messages."""

    def __init__(self) -> None:
        nat = _core.native()
        self.me, self.n = nat.my_pe, nat.n_pes
        self.box = st.empty(max(self.n, 1) * SLOT, dtype=_torch.uint8)
        self.sig = st.zeros(2 * self.n, dtype=_torch.int64)
        # Chunks sent to / received from each peer so far (the numbers of the signals).
        self.sent = [0] * self.n
        self.got = [0] * self.n
        self.sends: Dict[int, Deque[_Msg]] = {}
        self.recvs: Dict[int, Deque[_Msg]] = {}
        self.timeout = float(os.environ.get("SYMHEAP_TIMEOUT", "") or 300)
        _shmem.barrier_all()

    def _word(self, index: int) -> int:
        return int(_shmem.signal_fetch(self.sig, index))

    def _step_send(self, m: _Msg) -> bool:
        r = m.peer
        moved = False
        while not m.done and self._word(self.n + r) >= self.sent[r]:
            lo = m.done_chunks * SLOT
            chunk = m.bytes[lo : lo + SLOT]
            k = self.sent[r] + 1
            dest = self.box[self.me * SLOT : self.me * SLOT + chunk.numel()]
            if chunk.numel():
                _shmem.put_signal(dest, chunk, self.sig, k, r, sig_index=self.me)
            else:
                _shmem.atomic_set(self.sig, k, r, index=self.me)
            self.sent[r] = k
            m.done_chunks += 1
            moved = True
        return moved

    def _step_recv(self, m: _Msg) -> bool:
        s = m.peer
        moved = False
        while not m.done and self._word(s) > self.got[s]:
            lo = m.done_chunks * SLOT
            out = m.bytes[lo : lo + SLOT]
            out.copy_(self.box[s * SLOT : s * SLOT + out.numel()])
            if out.is_cuda:
                _torch.cuda.current_stream(out.device).synchronize()
            self.got[s] += 1
            _shmem.atomic_set(self.sig, self.got[s], s, index=self.n + self.me)
            m.done_chunks += 1
            moved = True
        if m.done and m.bytes.data_ptr() != m.t.data_ptr():
            m.t.copy_(m.bytes.view(m.t.dtype).view(m.t.shape))
        return moved

    def progress(self) -> bool:
        """Moves what can move without waiting; whether anything moved."""
        moved = False
        for queues, step in ((self.sends, self._step_send), (self.recvs, self._step_recv)):
            for q in queues.values():
                while q:
                    moved |= step(q[0])
                    if not q[0].done:
                        break
                    q.popleft()
        return moved

    def until(self, m: _Msg) -> None:
        """Moves messages until ``m`` is done; raises after the timeout without progress."""
        last = time.monotonic()
        pause = 0.0
        while not m.done:
            if self.progress():
                last, pause = time.monotonic(), 0.0
                continue
            if time.monotonic() - last > self.timeout:
                what = "send to" if m.send else "recv from"
                raise SymheapTimeoutError(
                    f"{what} PE {m.peer}: no progress for {self.timeout:g} s (the peer made no matching "
                    f"{'recv' if m.send else 'send'}; chunk {m.done_chunks + 1} of {m.chunks})"
                )
            time.sleep(pause)
            pause = min(pause * 2 or 1e-5, 1e-3)

    def send(self, t: _torch.Tensor, peer: int) -> Any:
        """Queues ``t`` for world PE ``peer``; returns its Work."""
        return self.post(True, t, peer)

    def recv(self, t: _torch.Tensor, peer: int) -> Any:
        """Queues a receive into ``t`` from world PE ``peer``; returns its Work."""
        return self.post(False, t, peer)

    def post(self, send: bool, t: _torch.Tensor, peer: int) -> Any:
        m = _Msg(send, t, peer)
        (self.sends if send else self.recvs).setdefault(peer, deque()).append(m)
        self.progress()
        return _P2PWork(self, m)


class _P2PWork(dist.Work):
    """The Work of a send or recv: ``wait()`` moves messages until this one is done."""

    def __init__(self, engine: _Engine, msg: _Msg) -> None:
        super().__init__()
        self._engine = engine
        self._msg = msg
        self._fut: Optional[Any] = None

    def wait(self, timeout: Any = None) -> bool:
        self._engine.until(self._msg)
        return True

    def is_completed(self) -> bool:
        return self._msg.done

    def is_success(self) -> bool:
        return self._msg.done

    def get_future(self) -> Any:
        if self._fut is None:
            self.wait()
            self._fut = _torch.futures.Future()
            self._fut.set_result([self._msg.t])
        return self._fut

    def result(self) -> List[_torch.Tensor]:
        self.wait()
        return [self._msg.t]


_engines: Dict[int, _Engine] = {}


def setup() -> None:
    """**Collective** over the world: makes this context's mailboxes (at the default group)."""
    key = id(_core.context())
    if key not in _engines:
        _engines.clear()
        _engines[key] = _Engine()


def engine() -> _Engine:
    eng = _engines.get(id(_core.context()))
    if eng is None:
        raise SymheapUnsupportedError("send/recv: the symheap mailboxes were not made (no default symheap group)")
    return eng


def forget() -> None:
    _engines.clear()
