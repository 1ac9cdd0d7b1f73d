"""pipeline.tools.dims_bench (docs/vm.md, "Speed"): it builds a symbolic model's VM
library and a static one per shape and runs both and onnxruntime, each in a process of
its own; bad arguments stop it with one line. No figure is checked: timings on this
machine mean nothing."""

from __future__ import annotations

import onnx
import pytest

from pipeline.tools import dims_bench
from tests.runtime.dims_models import encoder


def test_runs_the_three_sides(tmp_path):
    model = tmp_path / "enc.onnx"
    onnx.save(encoder(), model)
    dynamic, (static,) = dims_bench.build_libraries(
        str(model), {"batch": (1, 2), "seq": (1, 16)}, [{"batch": 2, "seq": 5}], tmp_path)
    row = dims_bench.compare(str(model), dynamic, static, {"batch": 2, "seq": 5}, tmp_path,
                             threads=1, rounds=1, runs=2, int_high=50)
    assert set(row) == {"dynamic", "static", "onnxruntime", "dynamic/static",
                        "dynamic/onnxruntime"}
    assert all(v > 0 for v in row.values())


@pytest.mark.parametrize("args, message", [
    (["--dims", "seq=1", "--at", "seq=3"], "--dims 'seq=1': expected NAME=LOW:HIGH"),
    (["--dims", "seq=1:8", "--at", "seq"], "--at 'seq': expected NAME=VALUE"),
    (["--dims", "seq=1:8", "--at", "seq=x"], "--at 'seq=x': expected NAME=VALUE"),
])
def test_bad_arguments_are_one_line(args, message):
    with pytest.raises(SystemExit) as err:
        dims_bench.main(["model.onnx", *args])
    assert message in str(err.value)
