"""The library's token-ranges build (omni_build_token_mask) against omni_hf/token_ranges.py at 1, 4097 and 9000
tokens (within, across and over several scan chunks), packed and random ids: a small case for compute-sanitizer
(`compute-sanitizer --tool memcheck|racecheck python benchmarks/results/issue16/session11/ranges_build_sanitize.py`).
"""
import sys

sys.path.insert(0, "tests")
import torch
from brute_force import packed_vlm_ids, random_token_ids
from omni_hf import _cuda
from omni_hf.token_ranges import token_ranges
assert _cuda.available()
for length in (1, 4097, 9000):
    for make in ("packed", "random"):
        doc, grp = (packed_vlm_ids(2, length, seed=length, gaps=True) if make == "packed" else random_token_ids(2, length, seed=length))
        *_, built = _cuda.token_mask(doc.cuda(), grp.cuda(), length, 128, 128, 700)
        assert torch.equal(built.cpu(), token_ranges(doc, grp, 700)), (length, make)
print("ranges ok")
