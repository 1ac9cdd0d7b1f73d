"""The Arm M-profile DSP extension's SIMD multiply-accumulate for the int8 kernels
(Cortex-M4, M7, M33: qconv_blocked.py's dot="smlad"), and the M-profile Vector
Extension's (MVE, Helium: Cortex-M55, M85: dot="mve").

SXTB16 (UXTB16 for unsigned bytes) widens bytes 0 and 2 of a word into the two
halfwords of a register, and with its free rotation by 8 bytes 1 and 3; SMLAD adds
the two halfword products of two such registers to an accumulator. So the sum of
four byte products of an input word and a weight word is two SXTB16 per word and
two SMLAD:

    acc + x0*w0 + x1*w1 + x2*w2 + x3*w3
        = smlad(xtb16(x ror 8), sxtb16(w ror 8), smlad(xtb16(x), sxtb16(w), acc))

A uint8 input is zero-extended (UXTB16): its halfwords 0..255 are exact signed
16-bit values, so unlike sdot or vpdpbusd no sign flip and no bias correction
for it is needed (offset 0). The convolution widens each input word of its tile
once and each weight word once, using it for all the tile's columns before the
next is loaded (dot4_tile: two weight halves live, not eight); the matmul
(dot4_lanes) leaves that sharing to LLVM's common-subexpression elimination (the
intrinsics have no side effects).

The depthwise kernel has no four-term sums (one filter per channel): it takes
a pixel's four channels as the halfword pairs (c0, c2) and (c1, c3) and adds each
product with SMLABB / SMLATT (bottom and top halfwords), one instruction per
channel and tap instead of a byte load and a multiply-add.

All are LLVM's ARM intrinsics (`llvm.arm.smlad`, `llvm.arm.sxtb16`, ...), which
select to the instructions for any core with the DSP extension.

MVE has no per-lane four-byte dot product, but a multiply-accumulate across a
vector into a general-purpose register (VMLAVA): the four products of an input
word and one output channel's four weights are a widening load of each
(VLDRB.U32 / VLDRB.S32 into i32 lanes) and one VMLAVA, which LLVM selects from
`acc + vector.reduce.add(mul(ext x, sext w))` on <4 x i32>; the input's word is
loaded once for the channels of a tile. In i32 lanes the input's sign needs no
offset either. The depthwise kernel multiplies and adds <4 x i32> vectors of four
channels (VMUL, VADD), which MVE has natively.
"""

from __future__ import annotations

import llvmlite.ir as ir

I8, I32 = ir.IntType(8), ir.IntType(32)
# Taps of a depthwise window up to which its rows are unrolled, the weights hoisted;
# a larger window (an average pool's 25 x 5) loops over its rows (flash).
UNROLLED_TAPS = 16

# M-profile cores with the DSP extension, for triples that do not imply it (v8-M
# Mainline has it optional; every ARMv7E-M core has it).
DSP_CPUS = {"cortex-m33", "cortex-m35p", "cortex-m52", "cortex-m55", "cortex-m85", "star-mc1"}


def has_dsp(target) -> bool:
    """Whether `target` is an M-profile Arm core with the DSP extension: an ARMv7E-M
    triple (thumbv7em: M4, M7), or a v8-M cpu with it, unless -mattr=-dsp."""
    feats = set(target.features.split(","))
    arch = target.arch
    if not arch.startswith("thumbv") or "-dsp" in feats:
        return False
    return "+dsp" in feats or arch.startswith("thumbv7em") or target.cpu in DSP_CPUS


# M-profile cores with integer MVE, for targets that do not name +mve.
MVE_CPUS = {"cortex-m52", "cortex-m55", "cortex-m85"}


def has_mve(target) -> bool:
    """Whether `target` is an M-profile Arm core with integer MVE (+mve or +mve.fp,
    or a cpu of MVE_CPUS), unless -mattr=-mve."""
    feats = set(target.features.split(","))
    if not target.arch.startswith("thumbv8.1m") or "-mve" in feats:
        return False
    return bool(feats & {"+mve", "+mve.fp"}) or target.cpu in MVE_CPUS


def _intrinsic(kb, name: str, *args) -> ir.Value:
    full = f"llvm.arm.{name}"
    fn = kb.module.globals.get(full)
    if fn is None:
        fn = ir.Function(kb.module, ir.FunctionType(I32, [I32] * len(args)), name=full)
    return kb.b.call(fn, list(args))


def halves(kb, word: ir.Value, signed: bool) -> tuple[ir.Value, ir.Value]:
    """(bytes 0 and 2, bytes 1 and 3) of an i32 as halfword pairs, sign- or
    zero-extended."""
    name = "sxtb16" if signed else "uxtb16"
    rotated = kb.b.or_(kb.b.lshr(word, ir.Constant(I32, 8)),
                       kb.b.shl(word, ir.Constant(I32, 24)))  # ror 8: folded into the op
    return _intrinsic(kb, name, word), _intrinsic(kb, name, rotated)


def dot4(kb, acc: ir.Value, x_word: ir.Value, w_word: ir.Value, x_signed: bool) -> ir.Value:
    """acc + the sum of the four products of the bytes of x_word and w_word (the
    weights signed; the input signed or not)."""
    xa, xb = halves(kb, x_word, x_signed)
    wa, wb = halves(kb, w_word, True)
    return _intrinsic(kb, "smlad", xb, wb, _intrinsic(kb, "smlad", xa, wa, acc))


def dot4_lanes(kb, acc: ir.Value, xv: ir.Value, wv: ir.Value, x_signed: bool) -> ir.Value:
    """qconv_blocked.dot for dot="smlad": acc (<L x i32>) plus per lane l the four
    products of xv's and wv's bytes 4l..4l+3 (both <4L x i8>)."""
    lanes = acc.type.count
    words = ir.VectorType(I32, lanes)
    xw, ww = kb.b.bitcast(xv, words), kb.b.bitcast(wv, words)
    for lane in range(lanes):
        k = ir.Constant(I32, lane)
        total = dot4(kb, kb.b.extract_element(acc, k), kb.b.extract_element(xw, k),
                     kb.b.extract_element(ww, k), x_signed)
        acc = kb.b.insert_element(acc, total, k)
    return acc


def dot4_tile(kb, accs: list, words: list, w, at, lanes: int, x_signed: bool) -> None:
    """The smlad tile's step: accs[k][j] (slots of <lanes x i32>) plus, per lane l of
    channel block k, the dot product of input word words[j] and the weights at
    w[at + 4 * (k * lanes + l)..]; the inputs widened once, each weight word used
    by all columns before the next is loaded (fewer registers live)."""
    xs = [halves(kb, word, x_signed) for word in words]
    sums = [[kb.get(slot) for slot in row] for row in accs]
    for k, row in enumerate(sums):
        for lane in range(lanes):
            wa, wb = halves(kb, kb.b.load(kb.gep(w, at + 4 * (k * lanes + lane)), typ=I32,
                                          align=1), True)
            index = ir.Constant(I32, lane)
            for j, (xa, xb) in enumerate(xs):
                total = _intrinsic(kb, "smlad", xb, wb, _intrinsic(
                    kb, "smlad", xa, wa, kb.b.extract_element(row[j], index)))
                row[j] = kb.b.insert_element(row[j], total, index)
    for slots, values in zip(accs, sums, strict=True):
        for slot, value in zip(slots, values, strict=True):
            kb.set(slot, value)


def depthwise_step(kb, accs: list[ir.Value], x_word: ir.Value, w_pair: tuple,
                   x_signed: bool) -> list[ir.Value]:
    """The four channel accumulators `accs` of a pixel plus x[c] * w[c] for the four
    channels of x_word, the weights given as halves() of their word."""
    xa, xb = halves(kb, x_word, x_signed)
    wa, wb = w_pair
    return [_intrinsic(kb, "smlabb", xa, wa, accs[0]), _intrinsic(kb, "smlabb", xb, wb, accs[1]),
            _intrinsic(kb, "smlatt", xa, wa, accs[2]), _intrinsic(kb, "smlatt", xb, wb, accs[3])]


def _sum(kb, v: ir.Value) -> ir.Value:
    name = f"llvm.vector.reduce.add.v{v.type.count}i32"
    fn = kb.module.globals.get(name)
    if fn is None:
        fn = ir.Function(kb.module, ir.FunctionType(I32, [v.type]), name=name)
    return kb.b.call(fn, [v])


def widen(kb, v: ir.Value, signed: bool) -> ir.Value:
    """<n x i8> (or an i32 word: four bytes) as <n x i32>, sign- or zero-extended."""
    if v.type == I32:
        v = kb.b.bitcast(v, ir.VectorType(ir.IntType(8), 4))
    wide = ir.VectorType(I32, v.type.count)
    return kb.b.sext(v, wide) if signed else kb.b.zext(v, wide)


def mve_dot4_lanes(kb, acc: ir.Value, x4: ir.Value, w4s: list, x_signed: bool) -> ir.Value:
    """qconv_blocked.dot for dot="mve": per lane l, acc[l] + the sum of the products
    of the four input channels x4 (<4 x i8>) and lane l's four weights w4s[l]."""
    xe = widen(kb, x4, x_signed)
    for lane, w4 in enumerate(w4s):
        k = ir.Constant(I32, lane)
        total = kb.b.add(kb.b.extract_element(acc, k),
                         _sum(kb, kb.b.mul(xe, widen(kb, w4, True))))
        acc = kb.b.insert_element(acc, total, k)
    return acc


def depthwise_tap(kb, w, at, smlad: bool):
    """A depthwise tap's four weights at w[at..]: halfword pairs (smlad) or <4 x i32>."""
    if smlad:
        return halves(kb, kb.b.load(kb.gep(w, at), typ=I32, align=1), True)
    return kb.b.sext(kb.b.load(kb.gep(w, at), typ=ir.VectorType(I8, 4), align=1),
                     ir.VectorType(I32, 4))


def depthwise_tile(kb, node, bufs, where, width, geometry, taps, store, cb) -> None:
    """qconv_blocked's depthwise tile of `width` output columns from `where` (plane,
    output row, first column) on an M-profile core: per tap and column one input
    word, its four channels added by SMLABB/SMLATT (dot smlad: depthwise_step) or
    as <4 x i32> (mve), then `store`d (qconv_blocked.Requantize). With attr pads the
    input is not padded: a tap outside it takes the word of attr fill. `taps`: the
    hoisted weights (depthwise_tap), or None for a window of more than
    UNROLLED_TAPS taps, whose rows are a loop (an average pool's 25 x 5)."""
    x, w, out = bufs
    plane, oh, ow0 = where
    _, _, hp, wp, ob = x.type.shape
    _, _, oh_n, ow_n, _ = out.type.shape
    kh_n, kw_n, sh, sw = geometry
    pt, pl, _, _ = node.attr("pads", (0, 0, 0, 0))
    fill = ir.Constant(I32, (node.attr("fill", 0) & 0xFF) * 0x01010101)
    smlad = node.attr("dot") == "smlad"
    signed = x.type.dtype == "int8"

    def row(kh, accs, tap, checked):
        ih = oh * sh + (kh - pt)
        for kw in range(kw_n):
            for j in range(width):
                iw = (ow0 + j) * sw + (kw - pl)
                at = ((plane * hp + ih) * wp + iw) * ob
                if not checked:
                    word = kb.b.load(kb.gep(x, at), typ=I32, align=1)
                else:  # a tap past the border reads the zero point: adds nothing
                    inside = kb.and_(kb.below(ih, hp), kb.below(iw, wp))
                    word = kb.b.select(inside, kb.b.load(kb.gep(x, kb.select(inside, at, 0)),
                                                         typ=I32, align=1), fill)
                accs[j] = depthwise_step(kb, accs[j], word, tap(kh, kw), signed) \
                    if smlad else [kb.b.add(accs[j][0], kb.b.mul(
                        widen(kb, word, signed), tap(kh, kw)))]
        return accs

    def window(checked):
        zero = [ir.Constant(I32, 0)] * 4 if smlad else [ir.Constant(ir.VectorType(I32, 4),
                                                                     [0] * 4)]
        accs = [list(zero) for _ in range(width)]
        if taps is not None:
            for kh in range(kh_n):
                accs = row(kh, accs, lambda kh, kw: taps[kh * kw_n + kw], checked)
            return accs
        slots = [[kb.local(v) for v in col] for col in accs]
        with kb.loop(0, kh_n, "kh") as kh:
            cur = row(kh, [[kb.get(v) for v in col] for col in slots],
                      lambda kh, kw: depthwise_tap(kb, w, ((cb * kh_n + kh) * kw_n + kw) * ob,
                                                   smlad), checked)
            for col, values in zip(slots, cur, strict=True):
                for slot, value in zip(col, values, strict=True):
                    kb.set(slot, value)
        return [[kb.get(v) for v in col] for col in slots]

    rows, cols = hp - kh_n + 1, wp - (width - 1) * sw - kw_n + 1  # clear of the border
    if node.attr("pads") is None or rows <= 0 or cols <= 0:
        finish(kb, window(node.attr("pads") is not None), width, store, (cb, out, plane, oh,
                                                                          ow0))
        return
    # Tiles clear of the border (most of them) check no tap.
    clear = kb.and_(kb.below(oh * sh - pt, rows), kb.below(ow0 * sw - pl, cols))
    with kb.b.if_else(clear) as (inner, border):
        with inner:
            finish(kb, window(False), width, store, (cb, out, plane, oh, ow0))
        with border:
            finish(kb, window(True), width, store, (cb, out, plane, oh, ow0))


def finish(kb, accs, width, store, where) -> None:
    """Store the `width` columns' accumulators of depthwise_tile (four i32 of the
    DSP extension's, or one <4 x i32>) through `store` at `where`."""
    cb, out, plane, oh, ow0 = where
    _, _, oh_n, ow_n, ob = out.type.shape
    for j in range(width):
        acc = accs[j][0]
        if len(accs[j]) > 1:
            acc = ir.Constant(ir.VectorType(I32, ob), None)
            for c in range(ob):
                acc = kb.b.insert_element(acc, accs[j][c], ir.Constant(I32, c))
        store(acc, cb * ob, out, ((plane * oh_n + oh) * ow_n + ow0 + j) * ob)
