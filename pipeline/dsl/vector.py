"""Vector and threading building blocks for the fast kernels (functions on a KernelBuilder).

- Explicit LLVM vectors `<n x float>` (loaded and stored with kb.vload, kb.vstore,
  kb.splat): fused multiply-add, max, constants and prefetches, with n the
  target's vector width, so a micro-kernel's register tile is what we wrote,
  not what the auto-vectoriser guessed.
- `apply_epilogue`: the fused elementwise chain of a kernel (bias, relu, residual
  add, clip, ...) applied to a whole vector of outputs at once.
- `parallel_for`: the kernel's outer loop outlined into a function that every
  thread of the team runs (the executor's pl_parallel, else libgomp's
  GOMP_parallel), each thread taking chunks of its own range first.
  The thread count is libgomp's current default, which the runtime sets per run
  with `omp_set_num_threads` (pipeline.runtime.graph_executor), capped by the
  kernel's estimated work: a small kernel runs inline on the calling thread.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import llvmlite.ir as ir

from pipeline.dsl.builder import F32, I32, PTR, Buffer, KernelBuilder
from pipeline.dsl.index import raw
from pipeline.ir.target import bare_metal_triple

VOID = ir.VoidType()


# Vector max/min are maxnum/minnum (NaN operands ignored), unlike the scalar
# kb.fmax/fmin (maximumnum, see builder.py): explicit vectors are no loop-carried
# reduction for the loop vectoriser, and maxnum is one instruction (vmaxps).
def _fmax(kb, a, b):
    return kb.intrinsic("maxnum", a, b)


def _fmin(kb, a, b):
    return kb.intrinsic("minnum", a, b)


def _const(x: float, like: ir.Value) -> ir.Constant:
    return ir.Constant(like.type, [float(x)] * like.type.count)


# Vector forms of the elementwise ops ResNet-like epilogues use, on float vectors:
# (kb, operands, node) -> value, with the ops' ONNX semantics. Any other op in an
# epilogue is applied lane by lane with its own scalar lowering.
VECTOR_OPS = {
    "identity": lambda kb, a, node: a[0],
    "relu": lambda kb, a, node: _fmax(kb, a[0], _const(0.0, a[0])),
    "clip": lambda kb, a, node: _fmin(kb, _fmax(kb, a[0], _const(node.attr("min"), a[0])),
                                      _const(node.attr("max"), a[0])),
    "add": lambda kb, a, node: kb.fadd(a[0], a[1]),
    "sub": lambda kb, a, node: kb.fsub(a[0], a[1]),
    "mul": lambda kb, a, node: kb.fmul(a[0], a[1]),
    "div": lambda kb, a, node: kb.fdiv(a[0], a[1]),
    "max": lambda kb, a, node: _fmax(kb, a[0], a[1]),
    "min": lambda kb, a, node: _fmin(kb, a[0], a[1]),
}


# Ops whose scalar lowering is written in lane-generic arithmetic (float32 vectors work
# as they are): an epilogue applies them to whole vectors, not lane by lane (a float32
# Gelu is a 50-operation polynomial: 16 scalar copies of it would cost 16 times more).
# op -> whether a node of it qualifies (Gelu's tanh form calls libm's tanhf: it does not).
# QuantizeLinear / DequantizeLinear to and from int8 / uint8 (kernels/quant.py): their
# integer operands come as i32 vectors (loads widen them), their stores narrow.
_INT8 = ("int8", "uint8")
LANE_GENERIC_OPS = {"gelu": lambda node: node.attr("approximate") == "none",
                    "quantize_linear": lambda node: node.attr("dtype") in _INT8,
                    "dequantize_linear": lambda node: node.attr("dtype") in _INT8}


def int8_operands(nodes: list) -> set[str]:
    """The int8/uint8 tensors the lane-generic quantize ops of `nodes` read or write:
    DequantizeLinear's x and zero point, QuantizeLinear's zero point and result."""
    names = set()
    for node in nodes:
        if node.op in ("quantize_linear", "dequantize_linear") and \
                LANE_GENERIC_OPS[node.op](node):
            names.update(node.inputs[2:3])
            names.update(node.inputs[:1] if node.op == "dequantize_linear" else node.outputs)
    return names


def vec(n: int, elem: ir.Type = F32) -> ir.VectorType:
    return ir.VectorType(elem, n)


def prefetch(kb: KernelBuilder, buf: Buffer, offset, write: bool = False) -> None:
    """Hint that `buf[offset]` will be read (or written) soon (prefetcht0 / prefetchw).
    The address may lie past the end of `buf`: prefetches never fault, and the GEP
    is not `inbounds`."""
    fn = _declare(kb.module, "llvm.prefetch.p0", VOID, [PTR, I32, I32, I32])
    kb.b.call(fn, [kb.gep(buf, offset, inbounds=False), ir.Constant(I32, int(write)),
                   ir.Constant(I32, 3), ir.Constant(I32, 1)])


def fma(kb: KernelBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a * b + c on float vectors with one rounding (llvm.fma)."""
    return kb.intrinsic("fma", a, b, c)


def zeros(n: int, elem: ir.Type = F32) -> ir.Constant:
    return ir.Constant(vec(n, elem), None)  # zeroinitializer: short IR text


def vmax(kb: KernelBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """Lane-wise maxnum of two float vectors."""
    return _fmax(kb, a, b)


def vconst(x: float, n: int) -> ir.Constant:
    """The float vector with every lane x."""
    zero = x == 0 and math.copysign(1.0, x) > 0  # zeroinitializer is +0.0, not -0.0
    return ir.Constant(vec(n), None if zero else [float(x)] * n)


def reduce_lanes(kb: KernelBuilder, v: ir.Value, combine) -> ir.Value:
    """combine over the lanes of the vector v as a tree of halves: log2(n) steps on
    whole vectors, not a chain of n - 1 scalar steps (a scalar maximumnum chain is
    several instructions a step). `combine(a, b)` takes two vectors."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo, hi = (kb.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n),
                                                         list(range(s, s + n))))
                  for s in (0, n))
        v = combine(lo, hi)
    return kb.lane(v, 0)


def transpose_square(kb: KernelBuilder, rows: list) -> list:
    """n vectors of n lanes (n a power of two) transposed: result[c][r] = rows[r][c].
    The off-diagonal blocks of n/2, n/4, ... 1 lanes swapped, each stage one two-input
    shuffle per vector (n log n shuffles for n^2 values, against n^2 lane moves)."""
    rows = list(rows)
    n, span = len(rows), len(rows) // 2
    while span:
        for r in (r for r in range(n) if not r & span):
            lo, hi = rows[r], rows[r + span]
            keep = [c if not c & span else n + c - span for c in range(n)]
            swap = [c + span if not c & span else n + c for c in range(n)]
            rows[r], rows[r + span] = (
                kb.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, n), mask))
                for mask in (keep, swap))
        span //= 2
    return rows


def prefetch_epilogue(kb: KernelBuilder, epilogue, out: Buffer, index: list) -> None:
    """Prefetch what the epilogue of the vector at `index` will touch: the output
    (for writing) and each argument it reads whole vectors of (a residual input,
    not a per-channel bias). Issued before a long reduction, these misses overlap
    with it instead of stalling the stores after it."""
    prefetch(kb, out, kb.dot(index, out.strides), write=True)
    if epilogue is None:
        return
    for node in epilogue.chain:
        for name in node.inputs:
            buf = epilogue.args.get(name)
            if buf is not None and buf.type.shape == out.type.shape:
                prefetch(kb, buf, kb.dot(index, buf.strides))


def apply_epilogue(kb: KernelBuilder, epilogue, value: ir.Value, index: list) -> ir.Value:
    """Run a kernel's fused elementwise chain on the n-lane `value` computed for the
    outputs at `index` .. `index` + n along the last dimension.

    `epilogue` is the Epilogue (dsl/epilogue.py) render.py passes to `lower`.
    """
    if epilogue is None:
        return value
    e = epilogue
    return apply_chain(kb, e.chain, e.args, e.scalar_of, e.dtypes,
                       {e.source: kb.narrow(value, e.dtypes[e.source])}, index, value.type.count)


def apply_chain(kb: KernelBuilder, chain: list, args: dict, scalar_of, dtypes: dict,
                env: dict, index: list, n: int) -> ir.Value:
    """The n-lane value of the chain's last output at `index` (first lane; the lanes
    run along the last dimension): `env` holds the values already known (tensor name
    -> vector), any other operand is loaded from `args` (load_broadcast)."""
    for node in chain:
        operands = [env[i] if i in env else kb.load_broadcast(args[i], index, n)
                    for i in node.inputs]
        if node.op in VECTOR_OPS and all(v.type == vec(n) for v in operands):
            env[node.outputs[0]] = kb.narrow(VECTOR_OPS[node.op](kb, operands, node),
                                             dtypes[node.outputs[0]])
            continue
        scalar = scalar_of(node.op)
        if node.op in LANE_GENERIC_OPS and LANE_GENERIC_OPS[node.op](node) and \
                all(isinstance(v.type, ir.VectorType) and v.type.count == n for v in operands):
            env[node.outputs[0]] = kb.narrow(scalar(kb, operands, node),
                                             dtypes[node.outputs[0]])
            continue
        # Lane by lane with the op's own scalar lowering: exact for any op, slower.
        lanes = [kb.narrow(scalar(kb, [kb.lane(v, k) for v in operands], node),
                           dtypes[node.outputs[0]]) for k in range(n)]
        out = ir.Constant(vec(n, lanes[0].type), None)
        for k, lane in enumerate(lanes):
            out = kb.with_lane(out, k, lane)
        env[node.outputs[0]] = out
    return env[chain[-1].outputs[0]]


def _thread_index(b: ir.IRBuilder, module: ir.Module) -> ir.Value:
    """The calling thread's index in the team (0 on the thread that called the
    kernel): the executor's pl_thread_index, else libgomp's omp_get_thread_num."""
    own = _declare(module, "pl_thread_index", I32, [])
    own.linkage = "extern_weak"
    gomp = _declare(module, "omp_get_thread_num", I32, [])
    is_own = b.icmp_unsigned("!=", own, ir.Constant(PTR, None))
    with b.if_else(is_own) as (then, otherwise):
        with then:
            from_own, own_block = b.call(own, []), b.block
        with otherwise:
            from_gomp, gomp_block = b.call(gomp, []), b.block
    index = b.phi(I32)
    index.add_incoming(from_own, own_block)
    index.add_incoming(from_gomp, gomp_block)
    return index


def _start_ranges(b: ir.IRBuilder, data: ir.Value, threads: ir.Value, n: ir.Value) -> None:
    """Store T (`threads`, i64) and each range's first item k*n/T as its counter."""
    b.store(threads, b.gep(data, [raw(1)], source_etype=PTR))
    entry, loop, after = b.block, b.append_basic_block("ranges"), b.append_basic_block("ranged")
    b.branch(loop)
    b.position_at_end(loop)
    k = b.phi(threads.type)
    k.add_incoming(raw(0), entry)
    first = b.udiv(b.mul(k, n), threads)
    b.store(first, b.gep(data, [b.mul(b.add(k, raw(1)), raw(SLOTS))], source_etype=PTR))
    k1 = b.add(k, raw(1))
    k.add_incoming(k1, loop)
    b.cbranch(b.icmp_unsigned("<", k1, threads), loop, after)
    b.position_at_end(after)


def _declare(module: ir.Module, name: str, ret: ir.Type, args: list) -> ir.Function:
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name=name)


def memcpy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, nbytes: ir.Value) -> None:
    """llvm.memcpy(dst, src, nbytes): non-overlapping bytes, an i64 count."""
    i64 = ir.IntType(64)
    fn = _declare(b.module, "llvm.memcpy.p0.p0.i64", VOID, [PTR, PTR, i64, ir.IntType(1)])
    b.call(fn, [dst, src, nbytes, ir.Constant(ir.IntType(1), 0)])


# Estimated work (multiply-adds or elements moved) below which a thread is not worth
# waking: the team's fork/join costs about a microsecond while the worker spins, about
# what 64K multiply-adds take. Splitting smaller kernels too pays beyond their own time:
# a kernel left on one thread reads the half of its input the other core wrote, from
# that core's cache (mobilenet_v2's 28x28 depthwise convs were slower at two threads
# than at one), where split the same way as its producer each thread reads its own.
# 1 << 20 before: at two threads shufflenet and the encoder took 18% longer, mobilenet_v2
# 8%. (On a loaded machine the executor's run-level choice falls back to one thread.)
MIN_WORK_PER_THREAD = 1 << 16


def thread_cap(n_items: int, work: int | None) -> int:
    """How many threads a loop of `n_items` items and `work` total is worth: at most
    one per item and one per MIN_WORK_PER_THREAD of work (no estimate: per item)."""
    by_work = n_items if work is None else work // MIN_WORK_PER_THREAD
    return max(1, min(n_items, by_work))


# Work items per grab: small enough that a thread the OS preempts holds up little
# work (the others take the rest), large enough that grabbing stays a small cost.
def _chunk(n_items: int) -> int:
    return max(1, n_items // 64)


# Work of one element read and written, in the multiply-adds parallel_for's `work`
# counts: moving a float costs about ten of them (a 450K-element layout transform
# took 37 us on one thread; a conv does ~8M multiply-adds in that time).
ELEMENT_WORK = 8


@contextmanager
def parallel_nest(kb: KernelBuilder, shape: tuple[int, ...], name: str = "o",
                  work: int | None = None):
    """kb.nest(shape) whose leading dims (as few as give 16 items, never the last)
    split over the thread team as parallel_for's items; yields the index list.
    The body is outlined as parallel_for says: it may use only values made inside it."""
    k = 0
    while k < len(shape) - 1 and math.prod(shape[:k]) < 16:
        k += 1
    items = math.prod(shape[:k])
    if items < 2:
        with kb.nest(shape, name) as index:
            yield index
        return
    with parallel_for(kb, items, name, work=work) as item:
        lead = kb.unflatten(item, shape[:k])
        with kb.nest(shape[k:], name) as tail:
            yield [*lead, *tail]


# Row bands: kernels that split rows over threads order their work items band by band
# (band outermost), so with two threads each takes the same half of every image, kernel
# after kernel, and reads what it wrote itself (not the other core's cache).
BANDS = 2


def band_of(item, images: int, bands: int, per_band: int) -> tuple:
    """(image, band, index within the band) of parallel_for's `item` over images x
    `bands` x `per_band` items."""
    n, rest = item // (bands * per_band), item % (bands * per_band)
    return n, rest // per_band, rest % per_band


@contextmanager
def band_row(kb: KernelBuilder, band, r, rows: int, bands: int, height: int):
    """Row r of band `band` (`rows` rows a band) of `height` rows; the body runs only
    for rows inside `height` (a last band may reach past it)."""
    row = band * rows + r
    with kb.if_(row < height) if bands * rows != height else nullcontext():
        yield row


def band_items(images: int, planes: int, height: int) -> int:
    """parallel_for's item count for band_plane_row: one per (image, plane, row),
    a last band past an odd height included."""
    bands = min(BANDS, height)
    return images * bands * planes * -(-height // bands)


@contextmanager
def band_plane_row(kb: KernelBuilder, item, images: int, planes: int, height: int):
    """(image, plane, row) of work item `item` of band_items(images, planes, height):
    bands of rows outermost, then planes (channel blocks), then the band's rows; the
    body runs only for rows inside `height`."""
    bands = min(BANDS, height)
    rows = -(-height // bands)
    n, band, r = band_of(item, images, bands, planes * rows)
    with band_row(kb, band, r % rows, rows, bands, height) as row:
        yield n, r // rows, row


# The loop's data block (on the calling thread's stack): the argument array, the
# thread count T, then T counters, one per 64-byte line (SLOTS pointer-sized slots)
# so that a thread grabbing from its own range never touches a line another thread
# writes. At most TEAM_MAX ranges, runtime/c/parallel.h's team size.
SLOTS, TEAM_MAX = 8, 64


@contextmanager
def parallel_for(kb: KernelBuilder, n_items: int, name: str = "task",
                 work: int | None = None, shared: tuple = ()):
    """`for i in range(n_items)`, split over the thread team; yields the i64 `i`.

    `work` estimates the whole loop's cost (multiply-adds, or elements touched):
    the team is min(the thread count, thread_cap(n_items, work)) threads, and
    with one thread the loop function is called directly (no fork/join at all).
    A kernel for a target without threads (a bare-metal triple, the c target:
    `kb.threads` false) gets a plain loop.

    The body is generated into an internal function `<kernel>.<name>(ptr data)`
    that every thread of the team runs (pl_parallel, or libgomp's GOMP_parallel
    in a library without the executor). The items are split into T contiguous
    ranges, one per thread: thread k (pl_thread_index, omp_get_thread_num) takes
    chunks of range k from that range's counter with an atomic add, then chunks of
    the other ranges still left (a thread the OS preempted or woke late does not
    hold up the kernel). Why ranges and not one shared counter: on a machine whose
    cores are far apart (a VM's vCPUs on two chiplets, ~200 ns a cache line) every
    grab of a shared counter moved its line between the cores, and the same thread
    now gets the same rows from one kernel to the next.
    While the body is generated, `kb` builds that function: its buffers' pointers,
    and those of `shared` (Buffers the kernel filled before the loop: stack scratch),
    are re-read from the arguments there (the Buffer objects are updated in place,
    so the lowering's and the epilogue's references stay valid) and restored after.
    """
    # No threads: a plain loop. render sets kb.threads from Target.threaded (false for
    # the c target); a builder made elsewhere has none: its triple decides.
    if bare_metal_triple(kb.module.triple) or not getattr(kb, "threads", True):
        with kb.loop(0, n_items, name) as i:
            yield i
        return
    module, outer_fn, outer_b = kb.module, kb.function, kb.b
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR]), name=f"{outer_fn.name}.{name}")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    buffers, args = [*kb.buffers, *shared], outer_fn.args[0]
    saved = [buf.ptr for buf in buffers]
    if shared:  # the loop function's argument array: the kernel's, then `shared`
        args = kb._alloca(PTR, raw(len(buffers)))
        for i, ptr in enumerate(saved):
            outer_b.store(ptr, outer_b.gep(args, [raw(i)], source_etype=PTR))
    kb.function, kb.b = fn, b
    cap = thread_cap(n_items, work)
    try:
        start, end, loop_back = _claim_chunks(kb, name, cap, n_items, buffers)
        with kb.loop(start, end, name) as i:
            yield i
        loop_back()
    finally:
        kb.function, kb.b = outer_fn, outer_b
        for buf, ptr in zip(buffers, saved, strict=True):
            buf.ptr = ptr
    _run_on_team(outer_b, fn, cap, n_items, name, args)


def _claim_chunks(kb: KernelBuilder, name: str, cap: int, n_items: int, buffers: list):
    """The loop function's head: rebind the buffers to the pointers in the data block,
    then claim chunks of this thread's range first and the other ranges' after.
    Returns (start, end) of the claimed chunk, the builder positioned where its loop
    goes, and a function that closes the loop function after that loop."""
    b, fn, module = kb.b, kb.function, kb.module
    chunk, n = _chunk(n_items), raw(n_items)
    data = fn.args[0]
    args = b.load(b.gep(data, [raw(0)], source_etype=PTR), typ=PTR)
    for i, buf in enumerate(buffers):
        slot = b.gep(args, [raw(i)], source_etype=PTR, inbounds=True)
        buf.ptr = b.load(slot, typ=PTR, name=f"buf{i}")
    if cap == 1:
        threads, home = raw(1), raw(0)
    else:
        threads = b.load(b.gep(data, [raw(1)], source_etype=PTR), typ=raw(0).type)
        home = b.urem(b.zext(_thread_index(b, module), threads.type), threads)
    victim, ranged, grab, take, following, done = (
        fn.append_basic_block(f"{name}.{s}")
        for s in ("victim", "range", "grab", "work", "next", "done"))
    entry = b.block
    b.branch(victim)
    b.position_at_end(victim)
    v = b.phi(threads.type, name="v")
    v.add_incoming(raw(0), entry)
    b.cbranch(b.icmp_unsigned("<", v, threads), ranged, done)
    b.position_at_end(ranged)  # range r = (home + v) % T: [r*n/T, (r+1)*n/T)
    r = b.urem(b.add(home, v), threads)
    hi = b.udiv(b.mul(b.add(r, raw(1)), n), threads)
    counter = b.gep(data, [b.mul(b.add(r, raw(1)), raw(SLOTS))], source_etype=PTR)
    b.branch(grab)
    b.position_at_end(grab)
    start = b.atomic_rmw("add", counter, raw(chunk), "monotonic")
    b.cbranch(b.icmp_signed("<", start, hi), take, following)
    b.position_at_end(take)
    end = b.add(start, raw(chunk))
    end = b.select(b.icmp_signed("<", end, hi), end, hi)

    def loop_back() -> None:
        kb.b.branch(grab)
        kb.b.position_at_end(following)
        v.add_incoming(kb.b.add(v, raw(1)), following)
        kb.b.branch(victim)
        kb.b.position_at_end(done)
        kb.b.ret_void()

    return start, end, loop_back


def _run_on_team(ob: ir.IRBuilder, fn: ir.Function, cap: int, n_items: int,
                 name: str, args: ir.Value) -> None:
    """In the kernel (builder `ob`): fill the loop function `fn`'s data block (`args`:
    its argument array) and call it on min(threads, cap) threads: the library's own
    team, libgomp's, or directly."""
    outer_fn, module = ob.function, ob.module
    with ob.goto_block(outer_fn.entry_basic_block):
        ob.position_at_start(outer_fn.entry_basic_block)
        data = ob.alloca(PTR, size=SLOTS * (TEAM_MAX + 1))
        data.align = 64
    ob.store(args, ob.gep(data, [raw(0)], source_etype=PTR))
    if cap == 1:
        ob.store(raw(0), ob.gep(data, [raw(SLOTS)], source_etype=PTR))
        ob.call(fn, [data])
        return
    threads = ob.call(_declare(module, "omp_get_max_threads", I32, []), [])
    limit = ir.Constant(I32, min(cap, TEAM_MAX))
    threads = ob.select(ob.icmp_signed("<", threads, limit), threads, limit)
    threads = ob.select(ob.icmp_signed("<", threads, ir.Constant(I32, 1)),
                        ir.Constant(I32, 1), threads)
    _start_ranges(ob, data, ob.zext(threads, raw(0).type), raw(n_items))
    team, alone = (outer_fn.append_basic_block(f"{name}.{s}") for s in ("team", "alone"))
    joined = outer_fn.append_basic_block(f"{name}.joined")
    ob.cbranch(ob.icmp_signed(">", threads, ir.Constant(I32, 1)), team, alone)
    ob.position_at_end(team)
    # The library's own team when the executor is linked in (runtime/c/parallel.h says
    # why); a weak reference, null in a library of kernels alone: then libgomp's.
    own = _declare(module, "pl_parallel", VOID, [PTR, PTR, I32])
    own.linkage = "extern_weak"
    gomp_block, own_block = (outer_fn.append_basic_block(f"{name}.{s}")
                             for s in ("gomp", "own"))
    ob.cbranch(ob.icmp_unsigned("!=", own, ir.Constant(PTR, None)), own_block, gomp_block)
    ob.position_at_end(own_block)
    ob.call(own, [fn, data, threads])
    ob.branch(joined)
    ob.position_at_end(gomp_block)
    gomp = _declare(module, "GOMP_parallel", VOID, [PTR, PTR, I32, I32])
    ob.call(gomp, [fn, data, threads, ir.Constant(I32, 0)])
    ob.branch(joined)
    ob.position_at_end(alone)
    ob.call(fn, [data])
    ob.branch(joined)
    ob.position_at_end(joined)
