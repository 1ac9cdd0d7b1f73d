"""conv2d_pointwise: a 1x1, stride-1, unpadded convolution on plain NCHW tensors, any
groups and any channel counts, register-blocked over output channels and pixels.

It takes the 1x1 convolutions the channel-blocked layout cannot (transform/layout.py):
grouped ones whose channels per group are not a multiple of the vector width
(shufflenet: 4 groups of 34) and ones whose filters are not (squeezenet's classifier,
1000 filters). Per group it is the GEMM out[g] (OC/g x P) = w[g] (OC/g x C/g) @
x[g] (C/g x P) over the P = H*W pixels, which are consecutive in NCHW:

  x [N, C, H, W]   w [OC, C/groups, 1, 1] (as imported)   bias [OC] (optional)
  out [N, OC, H, W]

A register tile holds R output channels x S vectors of `lanes` pixels: per input
channel it loads S input vectors and broadcasts R weights, R*S multiply-adds.
Work items are (image, group, tile of R channels), split over threads; a tile
loops over the plane's pixel blocks with its R weight rows staying in L1. Shapes
are static, so the remainders are handled without branches: the last channel tile
of a group starts early enough to end at the edge (recomputing a few channels to the
same values), and the pixels after the last whole block form a tile of their own
whose last vector is as narrow as the pixels left.

With `shuffle_groups` = s > 1 (transform/shuffle.py) the output is channel-shuffled:
channel k*m + j (m = OC/s) is stored to plane j*s + k, and the fused epilogue is
applied at that stored index (what it reads after the shuffle is laid out so; the ops
before it that the pass let through treat every channel alike).
"""

from __future__ import annotations

from pipeline.dsl.vector import apply_epilogue, fma, parallel_for, zeros
from pipeline.errors import ModelError
from pipeline.kernels.conv_blocked import registers
from pipeline.kernels.registry import lowering
from pipeline.kernels.windows import plane_epilogue
from pipeline.ops.geometry import ceil_div

# Pixel vectors per tile when the plane has that many (more: more input loads in
# flight, fewer channel rows fit the register file).
MAX_VECTORS = 4


MAX_ROWS = 8


def tile_shape(ocg: int, pixels: int, lanes: int) -> tuple[int, int, int]:
    """(lanes, S vectors, R rows) of the register tile for `ocg` channels per group."""
    lanes = min(lanes, pixels)
    s = min(MAX_VECTORS, ceil_div(pixels, lanes))
    # R*S accumulators, S input vectors and a broadcast weight in the register file
    r = max(1, min(ocg, MAX_ROWS, (registers(lanes) - s - 1) // s))
    return lanes, s, r


def _linear_epilogue(epilogue, plane: tuple[int, int]) -> bool:
    """Whether every argument the epilogue reads is either constant over the (H, W)
    plane or laid out like it, so a vector of pixels that runs over a row's end
    still maps to consecutive elements (else the epilogue runs in a second pass)."""
    if epilogue is None:
        return True
    chain, args = epilogue.chain, epilogue.args  # args: every buffer of the kernel
    read = [args[name] for node in chain for name in node.inputs if name in args]
    return all(tuple(buf.type.shape[-2:]) == plane or all(d == 1 for d in buf.type.shape[-2:])
               for buf in read)


def _lower(kb, node, ins, out, epilogue):
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    n_n, c, h, wd = x.type.shape
    oc_n, icg = w.type.shape[:2]
    groups = node.attr("groups")
    ocg, p_n = oc_n // groups, h * wd
    lanes, s, r = tile_shape(ocg, p_n, node.attr("lanes"))
    tiles = ceil_div(ocg, r)
    fused = _linear_epilogue(epilogue, (h, wd))
    shuffle = node.attr("shuffle_groups", 1)
    if oc_n % shuffle:
        raise ModelError(f"node {node.name!r} (conv2d_pointwise): {oc_n} filters do not "
                         f"shuffle in {shuffle} groups")

    def plane(o):
        """The output plane of channel o (the shuffled one's)."""
        return o if shuffle == 1 else (o % (oc_n // shuffle)) * shuffle + o // (oc_n // shuffle)

    with parallel_for(kb, n_n * groups * tiles, "tiles", work=out.type.size * icg) as item:
        image_group, t = item // tiles, item % tiles
        n, g = image_group // groups, image_group % groups
        oc0 = g * ocg + (kb.smin(t * r, ocg - r) if tiles > 1 else 0)
        x_base = (n * c + g * icg) * p_n

        def block(segments):
            """The tile's R channels x the pixels of `segments` [(offset, lanes)]."""
            accs = [[kb.local(kb.splat(kb.load(bias, oc0 + i), m) if bias else zeros(m))
                     for _, m in segments] for i in range(r)]
            with kb.loop(0, icg, "ic") as ic:
                row = x_base + ic * p_n
                xs = [kb.vload(x, row + off, m) for off, m in segments]
                for i in range(r):
                    weight = kb.load(w, (oc0 + i) * icg + ic)
                    for k, (xv, (_, m)) in enumerate(zip(xs, segments, strict=True)):
                        kb.set(accs[i][k], fma(kb, xv, kb.splat(weight, m),
                                               kb.get(accs[i][k])))
            for i in range(r):
                at = plane(oc0 + i)
                for k, (off, _) in enumerate(segments):
                    value = kb.get(accs[i][k])
                    if fused:
                        value = apply_epilogue(kb, epilogue, value,
                                               [n, at, off // wd, off % wd])
                    kb.vstore(out, (n * oc_n + at) * p_n + off, value)

        # Whole blocks of S vectors in a loop, then the rest: whole vectors and one
        # narrower vector for the last pixels (no lanes computed twice).
        width = s * lanes
        full = p_n // width
        if full == 1:
            block([(k * lanes, lanes) for k in range(s)])
        elif full:
            with kb.loop(0, full, "block") as j:
                block([(j * width + k * lanes, lanes) for k in range(s)])
        rest = range(full * width, p_n, lanes)
        if rest:
            block([(start, min(lanes, p_n - start)) for start in rest])
    if not fused:
        with kb.loop(0, n_n, "n") as n, kb.loop(0, oc_n, "oc") as oc:
            plane_epilogue(kb, out, (n * oc_n + oc) * p_n, n, oc, epilogue)


lowering("conv2d_pointwise", lower=_lower)
