"""benchmarks/bench_kernels.py's options on the CPU (its timing needs a GPU): the shape at other head dims and heads,
the features timed beside the plain call, the sliding window."""

import pytest

from benchmarks import bench_kernels, layouts


def test_defaults_are_the_realistic_shape_and_the_plain_call():
    args = bench_kernels.parse_args([])
    assert (args.masks, args.seqlens, args.features, args.window, args.rounds) == (
        ["vlm", "causal"], [8192, 16384], ("none",), None, 1)
    assert args.shape == bench_kernels.SHAPE


def test_features_head_dim_heads_and_window_parse():
    args = bench_kernels.parse_args(["--masks", "causal,sliding_window", "--seqlens", "8192", "--features",
                                     "bias,sinks", "--head-dim", "64", "--heads", "64/8", "--window", "128",
                                     "--rounds", "5"])
    assert args.features == ("none", "bias", "sinks")  # none always, first: the features' costs are against it
    assert (args.shape.dim, args.shape.heads_q, args.shape.heads_kv, args.shape.dtype, args.shape.batch) == (
        64, 64, 8, bench_kernels.SHAPE.dtype, 1)
    assert (args.masks, args.seqlens, args.window, args.rounds) == (["causal", "sliding_window"], [8192], 128, 5)
    assert bench_kernels.parse_args(["--features", "none,sinks"]).features == ("none", "sinks")
    assert "sliding_window" in layouts.MASKS


@pytest.mark.parametrize("bad", [["--features", "alibi"], ["--masks", "diagonal"], ["--head-dim", "60"],
                                 ["--head-dim", "520"], ["--heads", "32/5"], ["--heads", "32"], ["--heads", "a/b"],
                                 ["--seqlens", "8k"], ["--rounds", "0"], ["--window", "0"]])
def test_bad_options_are_refused(bad):
    with pytest.raises(SystemExit):
        bench_kernels.parse_args(bad)
