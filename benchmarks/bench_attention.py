"""The suite's realistic VLM + causal comparison under its old name (`python -m benchmarks.run` does it all).

    python -m benchmarks.bench_attention [--seqlens 8192,16384,32768] [--masks vlm,causal] [--no-backward]

Any `benchmarks.run` option given here overrides these defaults. ``vlm_ids`` and
``allowed_pairs_token_rule`` stay importable from this module for scripts written against it.
"""

from __future__ import annotations

import sys

from benchmarks.layouts import token_rule_pairs as allowed_pairs_token_rule  # noqa: F401
from benchmarks.layouts import vlm_ids  # noqa: F401
from benchmarks.run import main

if __name__ == "__main__":
    main(["--shapes", "realistic", "--masks", "vlm,causal", "--seqlens", "8192,16384,32768", *sys.argv[1:]])
