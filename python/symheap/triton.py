"""symheap's device-side library for Triton kernels.

Every function here is a ``@triton.jit`` function to call from inside a Triton kernel. None of
them is collective: they act on memory, and the kernels that use them are ordinary kernels
launched by each PE on its own.

The table
    Every function takes the allocation's peer table as a plain pointer argument ``heap_bases``
    (an ``int64`` tensor of ``n_pes`` entries, as returned by ``allocate_symmetric`` of
    :mod:`symheap.torch` or of any provider in :mod:`symheap.providers`, passed to the kernel like
    any tensor): ``heap_bases[r]`` is where PE r's copy of the allocation lies in this process,
    0 when PE r's copy is not load/store-addressable from here. Translation is::

        translate(ptr, from_rank, to_rank, heap_bases) = heap_bases[to_rank] + (ptr - heap_bases[from_rank])

    For symheap's own heap and NVSHMEM one table translates pointers of every allocation
    (``provider.peer_offsets()`` is not None); for torch SymmetricMemory pass the table of the
    allocation the pointer lies in. A table entry of 0 is not checked: accessing that PE faults
    (test with :func:`is_direct` first when the table may hold zeros).

Argument orders are those of Iris's device API (``iris.load``, ``iris.store``, ``iris.get``,
``iris.put``, ``iris.copy``, ``iris.atomic_*``), so an Iris kernel ports by changing its import
(``import symheap.triton as iris``) and passing a symheap table as ``heap_bases``. As in Iris,
``load`` takes ``(pointer, to_rank, from_rank, ...)`` where ``to_rank`` is the calling PE and
``from_rank`` the PE read from; every other function takes ``(..., from_rank, to_rank, ...)``
with ``from_rank`` the calling PE. Each docstring gives the exact translation it performs.

``hint`` (a ``tl.constexpr``: an int for 1-D blocks, a tuple for N-D ones) re-asserts on the
translated pointer what the compiler cannot prove any more: ``tl.multiple_of(p, hint)`` and
``tl.max_contiguous(p, hint)``, exactly as Iris applies it. A translated pointer is computed from
table entries loaded at run time, so without the hint the compiler knows nothing of its alignment
and emits scalar 4-byte accesses; with ``hint=16`` on a contiguous block whose local pointer is
16-byte aligned (the per-peer delta of every provider is a multiple of 16) it emits 16-byte
vector accesses (``st.global.v4`` / ``STG.E.128``, see ``scripts/triton_hint_check.py``).
Promising an alignment or contiguity the pointer does not have is undefined behaviour.

Ordering: ``load/store/get/put/copy`` are ordinary (weak) accesses. ``atomic_*`` take ``sem``
(``"relaxed"``, ``"acquire"``, ``"release"``, ``"acq_rel"``; default: Triton's ``acq_rel``) and
``scope`` (``"cta"``, ``"gpu"``, ``"sys"``); the default scope here is ``"sys"`` (every GPU and
the CPU) rather than Triton's ``"gpu"``, since a peer's memory is outside this GPU. Publishing
data then a signal: ``put(...)`` by every thread of the program, then ``signal_set`` /
``signal_add`` (a CTA barrier, then one release store/add at system scope); the receiver's
``signal_wait_until`` (acquire loads at system scope) then sees the data.

``import symheap.triton`` needs Triton (``pip install "symheap[triton]"``); ``import symheap`` does not
import it.
"""

# No "from __future__ import annotations": Triton reads the tl.constexpr annotations.
try:
    import triton
    import triton.language as tl
except ImportError as _e:  # say which extra installs it
    from ._requires import reraise

    reraise(_e, "triton", "symheap.triton")

__all__ = [
    "EQ",
    "NE",
    "GT",
    "GE",
    "LT",
    "LE",
    "translate",
    "is_direct",
    "load",
    "store",
    "copy",
    "get",
    "put",
    "atomic_add",
    "atomic_sub",
    "atomic_cas",
    "atomic_xchg",
    "atomic_and",
    "atomic_or",
    "atomic_xor",
    "atomic_min",
    "atomic_max",
    "signal_set",
    "signal_add",
    "signal_fetch",
    "signal_wait_until",
    "trap",
    "fence",
    "quiet",
]

# Comparison operators of signal_wait_until: the numbers of SYMHEAP_CMP_* in symheap.cuh and of
# the host API.
EQ = tl.constexpr(0)
NE = tl.constexpr(1)
GT = tl.constexpr(2)
GE = tl.constexpr(3)
LT = tl.constexpr(4)
LE = tl.constexpr(5)

# The default scope of the atomics: a peer's memory is outside this GPU.
_SYS = tl.constexpr("sys")


# ---- translation -------------------------------------------------------------------------------


@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr = None):
    """``ptr`` (a pointer or a block of pointers in PE ``from_rank``'s copy, as this process sees
    it) translated to PE ``to_rank``'s copy: ``heap_bases[to_rank] + (ptr - heap_bases[from_rank])``.

    ``hint``: see the module docstring (``tl.multiple_of`` + ``tl.max_contiguous`` on the result).
    Not collective.
    """
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    offset = tl.cast(ptr, tl.uint64) - from_base
    to_base_byte = tl.cast(to_base, tl.pointer_type(tl.int8))
    translated = tl.cast(to_base_byte + offset, ptr.dtype)
    if hint is not None:
        translated = tl.max_contiguous(tl.multiple_of(translated, hint), hint)
    return translated


@triton.jit
def is_direct(rank, heap_bases):
    """Whether PE ``rank``'s copy is load/store-addressable from here (``heap_bases[rank] != 0``).
    Not collective."""
    return tl.load(heap_bases + rank) != 0


# ---- element access ----------------------------------------------------------------------------


@triton.jit
def load(
    pointer,
    to_rank,
    from_rank,
    heap_bases,
    mask=None,
    other=None,
    cache_modifier=None,
    volatile=False,
    hint: tl.constexpr = None,
):
    """Reads PE ``from_rank``'s copy of ``pointer`` (Iris's order: ``to_rank`` is the calling PE,
    whose address space ``pointer`` is in). Loads ``translate(pointer, to_rank, from_rank)``
    with ``tl.load(mask, other, cache_modifier, volatile)`` and returns the block. Not collective."""
    translated = translate(pointer, to_rank, from_rank, heap_bases, hint)
    return tl.load(translated, mask=mask, other=other, cache_modifier=cache_modifier, volatile=volatile)


@triton.jit
def store(
    pointer,
    value,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    hint: tl.constexpr = None,
    cache_modifier=None,
):
    """Writes ``value`` to PE ``to_rank``'s copy of ``pointer`` (``from_rank`` is the calling PE):
    stores to ``translate(pointer, from_rank, to_rank)``. Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    tl.store(translated, value, mask=mask, cache_modifier=cache_modifier)


@triton.jit
def copy(
    src_ptr,
    dst_ptr,
    from_rank,
    to_rank,
    cur_rank,
    heap_bases,
    mask=None,
    other=None,
    load_cache_modifier=None,
    store_cache_modifier=None,
    hint: tl.constexpr = None,
):
    """Copies PE ``from_rank``'s copy of ``src_ptr`` into PE ``to_rank``'s copy of ``dst_ptr``.
    Both pointers are in the calling PE ``cur_rank``'s address space (which should be one of the
    two ranks); loads ``translate(src_ptr, cur_rank, from_rank)`` and stores to
    ``translate(dst_ptr, cur_rank, to_rank)``; ``hint`` applies to both. Not collective."""
    cur_base = tl.load(heap_bases + cur_rank)
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    src_offset = tl.cast(src_ptr, tl.uint64) - cur_base
    dst_offset = tl.cast(dst_ptr, tl.uint64) - cur_base
    translated_src = tl.cast(tl.cast(from_base, tl.pointer_type(tl.int8)) + src_offset, src_ptr.dtype)
    translated_dst = tl.cast(tl.cast(to_base, tl.pointer_type(tl.int8)) + dst_offset, dst_ptr.dtype)
    if hint is not None:
        translated_src = tl.max_contiguous(tl.multiple_of(translated_src, hint), hint)
        translated_dst = tl.max_contiguous(tl.multiple_of(translated_dst, hint), hint)
    data = tl.load(translated_src, mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(translated_dst, data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def get(
    from_ptr,
    to_ptr,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    other=None,
    load_cache_modifier=None,
    store_cache_modifier=None,
    hint: tl.constexpr = None,
):
    """Reads a peer's copy of symmetric ``from_ptr`` into local ``to_ptr`` (any memory of the
    calling PE). Loads ``translate(from_ptr, from_rank, to_rank)``, i.e. as Iris's kernels call
    it, ``get(src, dst, cur_rank, peer, heap_bases)`` reads PE ``peer``'s copy; ``hint`` applies
    to the translated (remote) pointer. Not collective."""
    translated = translate(from_ptr, from_rank, to_rank, heap_bases, hint)
    data = tl.load(translated, mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(to_ptr, data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(
    from_ptr,
    to_ptr,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    other=None,
    load_cache_modifier=None,
    store_cache_modifier=None,
    hint: tl.constexpr = None,
):
    """Writes local ``from_ptr`` (any memory of the calling PE ``from_rank``) into PE
    ``to_rank``'s copy of symmetric ``to_ptr``: stores to ``translate(to_ptr, from_rank,
    to_rank)``; ``hint`` applies to that pointer. Not collective."""
    translated = translate(to_ptr, from_rank, to_rank, heap_bases, hint)
    data = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(translated, data, mask=mask, cache_modifier=store_cache_modifier)


# ---- atomics (on PE to_rank's copy of pointer; from_rank = the calling PE) ---------------------


@triton.jit
def atomic_add(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_add`` on ``translate(pointer, from_rank, to_rank)``; returns the old values.
    ``sem`` defaults to Triton's (``acq_rel``), ``scope`` to ``"sys"``. Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_add(translated, val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_sub(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """Atomically subtracts ``val`` at ``translate(pointer, from_rank, to_rank)`` (an atomic add
    of ``-val``); returns the old values. Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_add(translated, -val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_cas(
    pointer,
    cmp,
    val,
    from_rank,
    to_rank,
    heap_bases,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_cas`` on ``translate(pointer, from_rank, to_rank)``: writes ``val`` where the
    word holds ``cmp``; returns the old values. ``cmp`` and ``val`` are cast to the pointed-to
    type first (so literals work on int64 words). No mask (as in Triton and Iris). Not
    collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    ty: tl.constexpr = pointer.dtype.element_ty
    return tl.atomic_cas(translated, tl.cast(cmp, ty), tl.cast(val, ty), sem=sem, scope=scope)


@triton.jit
def atomic_xchg(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_xchg`` on ``translate(pointer, from_rank, to_rank)``; returns the old values.
    Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_xchg(translated, val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_and(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_and`` on ``translate(pointer, from_rank, to_rank)``; returns the old values.
    Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_and(translated, val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_or(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_or`` on ``translate(pointer, from_rank, to_rank)``; returns the old values.
    Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_or(translated, val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_xor(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_xor`` on ``translate(pointer, from_rank, to_rank)``; returns the old values.
    Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_xor(translated, val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_min(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_min`` on ``translate(pointer, from_rank, to_rank)``; returns the old values.
    Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_min(translated, val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_max(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem=None,
    scope: tl.constexpr = _SYS,
    hint: tl.constexpr = None,
):
    """``tl.atomic_max`` on ``translate(pointer, from_rank, to_rank)``; returns the old values.
    Not collective."""
    translated = translate(pointer, from_rank, to_rank, heap_bases, hint)
    return tl.atomic_max(translated, val, mask=mask, sem=sem, scope=scope)


# ---- signals -----------------------------------------------------------------------------------
#
# A signal is a 32- or 64-bit integer word in symmetric memory (int64/uint64 tensors are the
# usual choice; symheap.cuh's signals are uint64). sig_ptr is a single pointer (not a block).


@triton.jit
def _ld_acquire(ptr):
    # An acquire load at system scope (PTX ld.acquire.sys), by every thread of the program.
    if ptr.dtype.element_ty.primitive_bitwidth == 64:
        v = tl.inline_asm_elementwise(
            "ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptr], dtype=ptr.dtype.element_ty, is_pure=False, pack=1
        )
    else:
        tl.static_assert(ptr.dtype.element_ty.primitive_bitwidth == 32, "signal words are 32- or 64-bit integers")
        v = tl.inline_asm_elementwise(
            "ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptr], dtype=ptr.dtype.element_ty, is_pure=False, pack=1
        )
    return v


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _compare(x, cmp: tl.constexpr, value):
    if cmp == 0:
        r = x == value
    elif cmp == 1:
        r = x != value
    elif cmp == 2:
        r = x > value
    elif cmp == 3:
        r = x >= value
    elif cmp == 4:
        r = x < value
    else:
        tl.static_assert(cmp == 5, "signal_wait_until: cmp must be EQ, NE, GT, GE, LT or LE")
        r = x <= value
    return r


@triton.jit
def signal_set(sig_ptr, value, from_rank, to_rank, heap_bases):
    """Sets PE ``to_rank``'s copy of signal word ``sig_ptr`` to ``value`` with a RELEASE store at
    system scope (``tl.atomic_xchg(sem="release", scope="sys")`` by one thread), after a CTA
    barrier: every store the program made before it, on any thread, is visible to whoever then
    observes the signal with an acquire (:func:`signal_wait_until`). Every thread of the
    program must call it. Not collective."""
    tl.debug_barrier()
    translated = translate(sig_ptr, from_rank, to_rank, heap_bases)
    tl.atomic_xchg(translated, value, sem="release", scope="sys")


@triton.jit
def signal_add(sig_ptr, value, from_rank, to_rank, heap_bases):
    """Adds ``value`` to PE ``to_rank``'s copy of signal word ``sig_ptr`` with a RELEASE atomic
    at system scope, after a CTA barrier (see :func:`signal_set`). Every thread of the program
    must call it. Not collective."""
    tl.debug_barrier()
    translated = translate(sig_ptr, from_rank, to_rank, heap_bases)
    tl.atomic_add(translated, value, sem="release", scope="sys")


@triton.jit
def signal_fetch(sig_ptr):
    """Reads the calling PE's own signal word ``sig_ptr`` with an ACQUIRE load at system scope.
    Not collective."""
    return _ld_acquire(sig_ptr)


@triton.jit
def trap():
    """Aborts the kernel: its launch fails with a CUDA error on the host. What a kernel does when
    a bounded :func:`signal_wait_until` returns 0 (the peer never arrived), so that a lost peer
    ends as an error instead of a hang or a wrong result."""
    tl.inline_asm_elementwise("trap;\nmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def signal_wait_until(sig_ptr, cmp: tl.constexpr, value, timeout_ns=None):
    """Waits until the calling PE's own signal word ``sig_ptr`` compares ``cmp`` (one of
    ``EQ NE GT GE LT LE``, a constexpr) to ``value``, polling with acquire loads at system scope
    (PTX ``ld.acquire.sys``) on every thread of the program. After it returns true, everything
    the signalling PE stored before its :func:`signal_set` / :func:`signal_add` is visible.

    ``timeout_ns`` None (the default) waits without bound: a peer that never signals hangs the
    kernel. With ``timeout_ns`` (an int64 run-time value) the wait gives up after that many
    nanoseconds of ``%globaltimer`` (0: test once). Returns whether the condition holds (an
    ``int1`` scalar). Not collective."""
    v = _ld_acquire(sig_ptr)
    done = _compare(v, cmp, value)
    if timeout_ns is None:
        while done == 0:
            v = _ld_acquire(sig_ptr)
            done = _compare(v, cmp, value)
    else:
        start = _globaltimer()
        while (done == 0) & ((_globaltimer() - start) < timeout_ns):
            v = _ld_acquire(sig_ptr)
            done = _compare(v, cmp, value)
    return done


# ---- ordering ----------------------------------------------------------------------------------


@triton.jit
def fence():
    """Orders the calling thread's earlier memory operations before its later ones for every
    observer in the system (PTX ``fence.acq_rel.sys``). Not collective."""
    tl.inline_asm_elementwise("fence.acq_rel.sys;\nmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def quiet():
    """Completes the calling thread's earlier stores (to any PE) before anything it does next
    (PTX ``fence.sc.sys``). Not collective."""
    tl.inline_asm_elementwise("fence.sc.sys;\nmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
