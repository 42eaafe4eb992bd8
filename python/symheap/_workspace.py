"""Capture-aware symmetric workspaces: the one kind of staging memory of every operation of the
package (the ordinary-tensor collectives of :mod:`symheap.ops`, :mod:`symheap.fused`,
:mod:`symheap.gemm` and :class:`symheap.moe.Buffer`).

A :class:`Workspace` is symmetric memory of one operation on this PE: named regions (zeroed
where the operation keeps flags), optionally the heap bases of its team's members on the
device, and a small int64 counter tensor for kernels that count their calls on the device (the
epochs their flags carry). A :class:`Pool` keeps one workspace per key (team, stream, kind...)
for the current context, and every operation follows the same rules through it:

* **Growth**: a call that needs more than its workspace holds gets a new, larger one. Making one
  allocates symmetric memory, which is **collective over the world**: every PE grows at the same
  call because every PE makes the same calls in the same order with the same sizes.
* **CUDA graph capture**: a workspace used during capture is marked captured. A graph replays on
  its addresses and counters, so it is never freed or moved: when a later call needs more, it is
  retired (kept alive until finalize) and a new one is made. No CUDA memory can be allocated
  during capture; what a pool does with a call its workspace is too small for is its policy
  (``under_capture``): ``"raise"`` (the caller must warm up or reserve before capture),
  ``"reuse"`` (the operation splits the call into pieces that fit) or ``"make"`` (the pool's
  ``make`` takes heap memory already mapped, and raises itself when there is not enough).
* **Finalize**: the workspaces of a context are forgotten when it ends (their memory goes with
  it), by one hook per context for every pool, registered at the first use. A context that ended
  without finalize (an abort) is noticed at the next context's first use.

The ordinary-tensor staging of :mod:`symheap.ops` (one byte buffer per team and stream) is the
pool at the end of this module.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch as _torch

from . import _core, _shmem
from . import torch as st
from ._native import SymheapValueError, Team

Size = Tuple[int, ...]

# Alignment of the regions the staging cuts from its buffer (the LL128 kernels want 16 bytes).
ALIGN = 256


_cuda: Optional[bool] = None


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (never on a machine without CUDA)."""
    global _cuda
    if _cuda is None:
        # Asked once: torch.cuda.is_available() costs more than the rest of a small eager
        # collective's staging, and a process's GPUs do not come or go while it runs.
        _cuda = bool(_torch.cuda.is_available())
    return _cuda and _torch.cuda.is_current_stream_capturing()


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN`."""
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


class Workspace:
    """Symmetric memory of one operation on this PE. **Collective** over the world (symmetric
    allocations, and a barrier with ``barrier``).

    ``members``: the world PEs of the team it serves (:attr:`me` is this PE's index among them,
    -1 outside it; :attr:`npes` their number); ``size``: what it was made for, compared element
    by element with what a call needs (:meth:`fits`); ``regions``: name -> ``(elements, dtype)``,
    symmetric tensors allocated in that order (``zeroed``: the names filled with zeros: flags);
    ``counters``: the length of :attr:`ctr`, int64 zeros on this PE's device (0: none);
    ``bases``: also :attr:`bases`, the members' heap bases as an int64 tensor on the device;
    ``barrier``: a barrier at the end (stream-ordered on CUDA), so that no peer signals into
    flags another PE has not zeroed yet. :attr:`cache` holds what the operation derives from
    the regions (views), dropped with them; :attr:`owner` the object the workspace serves, for
    operations that find it by key.
    """

    def __init__(
        self,
        members: Sequence[int],
        size: Sequence[int],
        regions: Dict[str, Tuple[int, _torch.dtype]],
        *,
        zeroed: Sequence[str] = (),
        counters: int = 0,
        bases: bool = False,
        barrier: bool = False,
    ) -> None:
        nat = _core.native()
        self.members: Tuple[int, ...] = tuple(members)
        self.me = self.members.index(nat.my_pe) if nat.my_pe in self.members else -1
        self.npes = len(self.members)
        self.size: Size = tuple(size)
        self.regions: Dict[str, _torch.Tensor] = {
            name: (st.zeros if name in zeroed else st.empty)(n, dtype=dt) for name, (n, dt) in regions.items()
        }
        dev = st.device()
        self.ctr: Optional[_torch.Tensor] = _torch.zeros(counters, dtype=_torch.int64, device=dev) if counters else None
        self.bases: Optional[_torch.Tensor] = None
        if bases:
            world = nat.heap_bases()
            self.bases = _torch.tensor([world[m] for m in self.members], dtype=_torch.int64, device=dev)
        self.captured = False
        self.cache: Dict[Any, Any] = {}
        self.owner: Any = None
        if barrier:
            _shmem.barrier_all()

    @property
    def nbytes(self) -> int:
        """Symmetric bytes of its regions."""
        return sum(int(r.numel()) * r.element_size() for r in self.regions.values())

    def fits(self, need: Sequence[int]) -> bool:
        """Whether it holds a call needing ``need`` (element by element against :attr:`size`)."""
        return all(n <= have for n, have in zip(need, self.size))

    def free(self) -> None:
        """Releases the regions now, stream-ordered (the reclaim waits for the streams that used
        them). Never for a workspace a CUDA graph captured (its :class:`Pool` keeps those)."""
        self.cache.clear()
        for r in self.regions.values():
            st.free(r)
        self.regions.clear()


# Every pool, for the finalize hook; the context their workspaces belong to.
_pools: List["Pool"] = []
_owner: Optional["weakref.ref[Any]"] = None


def bind() -> None:
    """Ties the pools to the current context: at its first use, forgets what an earlier context
    left (ended without finalize) and registers the finalize hook."""
    global _owner
    ctx = _core.context()  # raises before symheap.init()
    if _owner is not None and _owner() is ctx:
        return
    _forget()
    _owner = weakref.ref(ctx)
    _core._before_finalize.append(_forget)


def _current() -> bool:
    """Whether the pools hold the current context's workspaces (False without a context)."""
    return _owner is not None and _core.is_initialized() and _owner() is _core.context()


def _forget() -> None:
    """The finalize hook: every pool drops its workspaces, retired ones too (the memory goes
    with the context), and runs its ``on_forget``."""
    global _owner
    _owner = None
    _members.clear()
    for p in _pools:
        p._spaces.clear()
        p._retired.clear()
        if p.on_forget is not None:
            p.on_forget()


class Pool:
    """The workspaces of one operation on this PE, one per key, for the current context.

    ``what``: the operation, for messages; ``make(key, size)``: a new :class:`Workspace` for
    ``key`` holding ``size`` (collective); ``size_for(size)``: the size made for a call needing
    ``size`` (element by element at least the old workspace's); ``under_capture``: ``"raise"``,
    ``"reuse"`` or ``"make"`` (module docstring); ``hint``: what the error raised under capture
    tells the caller to do; ``on_forget``: run when the context's workspaces are forgotten (the
    operation's caches by context).
    """

    def __init__(
        self,
        what: str,
        make: Optional[Callable[[Any, Size], Workspace]] = None,
        *,
        size_for: Callable[[Size], Size] = lambda s: s,
        under_capture: str = "raise",
        hint: str = "",
        on_forget: Optional[Callable[[], None]] = None,
    ) -> None:
        self.what = what
        self.make = make
        self.size_for = size_for
        self.under_capture = under_capture
        self.hint = hint
        self.on_forget = on_forget
        self._spaces: Dict[Hashable, Workspace] = {}
        self._retired: List[Workspace] = []
        _pools.append(self)

    def find(self, key: Hashable) -> Optional[Workspace]:
        """The workspace of ``key`` in the current context, or None (also without a context)."""
        return self._spaces.get(key) if _current() else None

    def workspaces(self) -> List[Workspace]:
        """The live (not retired) workspaces of the current context; none without one."""
        return list(self._spaces.values()) if _current() else []

    def get(self, key: Hashable, need: Sequence[int], what: Optional[str] = None) -> Workspace:
        """The workspace of ``key``, made or grown to hold ``need`` (**collective** over the
        world when it is made: every PE makes the same calls with the same sizes). Under CUDA
        graph capture: the pool's policy; the workspace returned is marked captured."""
        bind()
        need = tuple(need)
        ws = self._spaces.get(key)
        cap = capturing()
        if ws is not None and (ws.fits(need) or (cap and self.under_capture == "reuse")):
            ws.captured = ws.captured or cap
            return ws
        if cap and self.under_capture != "make":
            state = "no workspace yet" if ws is None else "the workspace is too small for this call"
            raise SymheapValueError(
                f"{what or self.what}: {state}, and none can be allocated during CUDA graph capture: {self.hint}"
            )
        size = need if ws is None else tuple(max(a, b) for a, b in zip(ws.size, need))
        return self._replace(key, ws, self.size_for(size), cap)

    def reserve(self, key: Hashable, need: Sequence[int], what: str) -> Workspace:
        """:meth:`get` outside capture: sizes the workspace of ``key`` before a graph captures
        calls on it (**collective** over the world)."""
        if capturing():
            raise SymheapValueError(f"{what} cannot run during CUDA graph capture; call it before")
        return self.get(key, need, what)

    def add(self, key: Hashable, ws: Workspace) -> None:
        """Files a workspace made by the operation itself (a fixed size, never grown)."""
        bind()
        self._spaces[key] = ws

    def release(self, key: Hashable) -> None:
        """Forgets the workspace of ``key`` and frees it now (the operation's own, explicit
        release; its callers made sure no peer still uses it)."""
        ws = self._spaces.pop(key, None)
        if ws is not None:
            ws.free()

    def _replace(self, key: Hashable, old: Optional[Workspace], size: Size, cap: bool) -> Workspace:
        if self.make is None:
            raise SymheapValueError(f"{self.what}: no workspace for {key!r}, and this pool makes none")
        if old is not None:
            if old.captured or cap:
                # A graph replays on its addresses and counters (and nothing is freed during
                # capture): kept until finalize.
                self._retired.append(old)
            else:
                old.free()
        ws = self.make(key, size)
        ws.captured = cap
        self._spaces[key] = ws
        return ws


# ---- the ordinary-tensor staging of symheap.ops --------------------------------------------
#
# symheap's collectives read and write symmetric memory (peers address it directly), so an
# ordinary tensor from PyTorch's allocator is copied into a staging buffer before the call and,
# where it is written, copied back after it, all on the collective's stream (capturable). One
# buffer per (team, stream), grown to the next power of two of what a call needs. A team that
# is not the whole world cannot grow on demand (its non-members would not allocate): its
# staging is reserved on every PE first (:func:`reserve_staging`). During capture a new buffer
# is taken only from heap memory already mapped.

# The smallest staging buffer (bytes).
MIN_STAGING = 64 << 10
# Layouts whose views a staging workspace keeps cut (see staging_views).
MAX_LAYOUTS = 256


def _pow2(size: Size) -> Size:
    n = MIN_STAGING
    while n < size[0]:
        n *= 2
    return (n,)


def _make_staging(key: Tuple[Tuple[int, ...], int], size: Size) -> Workspace:
    if capturing():
        use = _core.native().heap_usage()
        if use["mapped"] - use["in_use"] < size[0] + ALIGN:
            raise SymheapValueError(
                f"the symheap staging workspace of this team and capturing stream needs {size[0]} bytes, and "
                "the heap would have to grow during CUDA graph capture: warm up by running the same call once "
                "on the capture stream before capture, or call symheap.ops.reserve_workspace there"
            )
    return Workspace(key[0], size, {"buf": (size[0], _torch.uint8)})


_staging = Pool("symheap staging", _make_staging, size_for=_pow2, under_capture="make")


def stream_key() -> int:
    """The current torch stream's handle on the CUDA backend, 0 on the host backend."""
    n = _core.native()
    if n.backend != "cuda":
        return 0
    return _core.current_stream_handle(n.device_ordinal)


# Team -> its members (a call into the native layer each time otherwise); teams are hashable
# and live until finalize, which clears this with the workspaces.
_members: Dict[Optional[Team], Tuple[int, ...]] = {}


def _staging_key(team: Optional[Team]) -> Tuple[Tuple[int, ...], int]:
    # Tied to the current context first: a context that ended without finalize leaves its
    # members (another world size) in _members until bind() notices the new one.
    bind()
    members = _members.get(team)
    if members is None:
        members = tuple(range(_core.native().n_pes)) if team is None else tuple(team.members)
        _members[team] = members
    return (members, stream_key())


def staging(team: Optional[Team], nbytes: int) -> _torch.Tensor:
    """A symmetric uint8 tensor of at least ``nbytes`` for ``team`` on the current stream; grows
    the staging when needed (collective over the world, see above)."""
    return _staging_workspace(team, nbytes).regions["buf"]


def _staging_workspace(team: Optional[Team], nbytes: int) -> Workspace:
    key = _staging_key(team)
    n = _core.native().n_pes
    if team is not None and team.n_pes() != n:
        ws = _staging.find(key)
        if ws is None or not ws.fits((nbytes,)):
            have = 0 if ws is None else ws.size[0]
            raise SymheapValueError(
                f"the symheap staging workspace of a team of {team.n_pes()} of {n} PEs holds {have} bytes, the "
                f"call needs {nbytes}, and it cannot grow on demand (growing allocates on every PE): call "
                "symheap.ops.reserve_workspace(nbytes, team) on every PE first (on the capture stream before a "
                "CUDA graph capture), or pass symmetric tensors"
            )
    return _staging.get(key, (nbytes,))


def reserve_staging(nbytes: int, team: Optional[Team] = None) -> None:
    """**Collective** over the world: makes the staging of ``team`` on the current stream hold
    at least ``nbytes`` (every PE calls it, members of ``team`` or not)."""
    nbytes = _core.index_arg(nbytes, "workspace bytes")
    _staging.reserve(_staging_key(team), (nbytes,), "reserve_workspace")


def staging_views(team: Optional[Team], parts: Sequence[Tuple[_torch.Tensor, bool]]) -> List[Optional[_torch.Tensor]]:
    """For each ``(tensor, staged)`` of ``parts``: a view of the staging of ``team`` on the
    current stream with the tensor's dtype and shape when ``staged``, else None. Every part,
    staged or not, takes an aligned slot in order, so the size (and the growth, collective
    over the world) is the same on every PE whichever of its tensors are symmetric. The views
    are cut once per workspace and layout (cutting them costs more than a small collective)."""
    layout = tuple((t.dtype, tuple(t.shape), staged) for t, staged in parts)
    need = sum(aligned(t.numel() * t.element_size()) for t, _ in parts)
    ws = _staging_workspace(team, need)
    views = ws.cache.get(layout)
    if views is None:
        if len(ws.cache) >= MAX_LAYOUTS:
            ws.cache.clear()  # shapes that vary call to call (sequence lengths) stay bounded
        buf, off, views = ws.regions["buf"], 0, []
        for t, staged in parts:
            views.append(region(buf, off, t) if staged else None)
            off += aligned(t.numel() * t.element_size())
        ws.cache[layout] = views
    return list(views)


def region(buf: _torch.Tensor, offset: int, like: Any, shape: Any = None) -> _torch.Tensor:
    """A view of ``buf`` at byte ``offset`` with ``like``'s dtype and ``shape`` (default
    ``like``'s)."""
    shape = tuple(like.shape) if shape is None else tuple(shape)
    numel = 1
    for s in shape:
        numel *= int(s)
    nb = numel * like.element_size()
    return buf[offset : offset + nb].view(like.dtype).view(shape)


def staging_usage() -> Dict[str, int]:
    """``{workspaces, bytes, captured}`` of this PE's staging (for tests and diagnostics)."""
    live = _staging.workspaces()
    return {
        "workspaces": len(live),
        "bytes": sum(w.nbytes for w in live),
        "captured": sum(1 for w in live if w.captured),
    }
