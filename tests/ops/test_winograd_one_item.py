"""A Winograd conv whose output is one work item of tiles (a 12 x 12 output: 9 tiles,
one register tile; alexnet's and zfnet512's 3x3 layers) splits its output channel
groups into two work items, so the second thread has work. Against onnx.reference at
one and two threads: an even and an odd number of channel groups, 16 and 8 lanes
(transformed weights of SPLIT_WEIGHT_BYTES or more: smaller ones keep two items of
tiles)."""

from __future__ import annotations

import pytest

from pipeline.kernels import conv_winograd
from tests.support.fast_kernels import (
    AVX512,
    HASWELL,
    RELU,
    check_winograd,
    conv_net,
    host_has_avx512,
)


@pytest.mark.parametrize("target, c, oc", [
    pytest.param(AVX512, 256, 256, id="avx512-4groups", marks=pytest.mark.skipif(
        not host_has_avx512(), reason="host has no AVX-512")),
    pytest.param(AVX512, 256, 320, id="avx512-5groups", marks=pytest.mark.skipif(
        not host_has_avx512(), reason="host has no AVX-512")),
    pytest.param(HASWELL, 256, 232, id="haswell-29groups"),
])
def test_single_item_winograd_splits_channel_groups(target, c, oc):
    vw = 16 if target == AVX512 else 8
    k, t, s = conv_winograd.plan(12, 12, c, oc, conv_winograd.TILE, vw)
    assert -(-9 // (t * s)) == 1 and oc // (k * vw) > 1  # one item, several groups
    assert 36 * c * oc * 4 >= conv_winograd.SPLIT_WEIGHT_BYTES
    model, feeds = conv_net(c=c, oc=oc, hw=12, after=[RELU])
    check_winograd(model, feeds, target)


@pytest.mark.skipif(not host_has_avx512(), reason="host has no AVX-512")
def test_two_register_tiles_in_two_items_split_channel_groups_too():
    """zfnet512's 12 x 12 256 -> 512 layer: its two register tiles are two work items
    (the scratch holds one), each of which would stream all 18 MiB of transformed
    weights; they become four, two halves of the channel groups x the two items."""
    c, oc, hw = 256, 512, 12
    k, t, s = conv_winograd.plan(hw, hw, c, oc, conv_winograd.TILE, 16)
    assert (t, s) == (5, 1) and oc // (k * 16) > 1  # 9 tiles: two items
    model, feeds = conv_net(c=c, oc=oc, hw=hw, after=[RELU])
    check_winograd(model, feeds, AVX512)
