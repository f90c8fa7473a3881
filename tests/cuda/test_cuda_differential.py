"""A seeded randomized differential run of the CUDA kernels: 240 cases of block masks, each drawing its
configuration from its seed (the test id says it): random token-rule masks (packed documents, padding, images,
windows; ids of batch 1 broadcast now and then) and random dense masks (every block type, per-head masks, emptied
rows), lengths up to ~4k off the block grid, batch 2, GQA 1 / 4 / 8, head dims 64 / 96 / 128, fp16 / bf16,
q_len < kv_len and q_len = 1, the four block-size pairs, BSHD views (what Transformers hands over) or contiguous
BHSD, and on Hopper the sm_90a or the sm_80 kernels; half the windowed token-rule cases cut image pairs too
(``window_covers_groups``). Then 120 cases of implicit masks (seeds 240 to 359):
``OmniBlockMask.causal`` (a random window about half the time) and ``OmniBlockMask.full``, lengths as above, GQA 1 to
16, head dims 64 / 96 / 128 and now and then 40 or 80 (run on the next instantiated dim), q_len = kv_len, 1, 2 to 16
or random, some 40% of them with at most 16 query rows per KV head (q_len * Hq / Hkv), whose forward runs on the
split-KV decode kernel (up to 8 KV heads there). Then 60 cases of token-rule masks whose window cuts image pairs too
(seeds 360 to 419): windows of 1 to 400 keys against images of 20 to 600, ids numbered as the collator does (each
document and image one run: the Hopper kernels test ranges) or at random (shared and split ids: they compare ids).

Each case runs the public op, ``omni_hf.omni_attention`` with ``OMNI_HF_BACKEND=cuda`` (forward and autograd
backward), and compares out, LSE, dq, dk and dv with the reference in float64 under the brute-force dense mask (for an
implicit mask, built from position comparisons in tests/helpers/brute_force.py, not from the mask).
Bounds (those of tests/cuda/test_cuda_forward.py and tests/cuda/test_cuda_backward.py): out and each gradient may be at
most ``ROUNDINGS_BOUND`` times as far from float64 as the reference implementation run in the same dtype; LSE within
``LSE_ATOL`` of float64. Rows with no allowed key must give exactly 0 and LSE -inf, and exactly zero gradients, as
must keys no query of their group sees. With ``OMNI_HF_DIFF_LOG=/path/file`` every case appends one line (its
configuration, errors and bounds) to that file, passing or not.

Skipped without CUDA, or where the CUDA backend cannot run (no library, unsupported GPU).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import pytest
import torch

from omni_hf import OmniBlockMask, omni_attention
from omni_hf.ops import reference
from tests.helpers.brute_force import causal_dense, packed_vlm_ids, random_token_ids, relative_error, token_rule_dense

pytestmark = pytest.mark.gpu

CASES = 240
IMPLICIT_CASES = 120  # seeds CASES to CASES + IMPLICIT_CASES - 1
WINDOWED_GROUP_CASES = 60  # the seeds after those
DECODE_ROWS = 16  # csrc/decode/decode.cuh kMaxRows: implicit masks with q_len * Hq / Hkv <= 16 take the decode kernel
ROUNDINGS_BOUND = 4.0  # kernel error / same-dtype reference error, as tests/cuda/test_cuda_backward.py derives it
LSE_ATOL = 2e-3  # as tests/cuda/test_cuda_forward.py
BLOCKS = ((64, 64), (128, 128), (64, 128), (128, 64))


@pytest.fixture(scope="module", autouse=True)
def cuda_backend_runs():
    """Skip the module where ``OMNI_HF_BACKEND=cuda`` cannot run a small call."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNI_HF_BACKEND", "cuda")
        q = torch.randn(1, 1, 64, 64, device="cuda", dtype=torch.bfloat16)
        try:
            omni_attention(q, q, q, OmniBlockMask.causal(64))
        except RuntimeError as err:
            pytest.skip(f"the CUDA backend cannot run here: {err}")


def drawer(seed: int) -> Callable[[int, int], int]:
    """``draw(lo, hi)``: a uniform int in ``[lo, hi]`` from a CPU generator seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=gen))


def draw_kv_len(draw: Callable[[int, int], int]) -> int:
    """A key length off the block grid: 1/7 long (3000 to 4200), 1/7 short (1 to 200), else 200 to 2100."""
    return (draw(3000, 4200), draw(1, 200), draw(200, 2100))[min(2, draw(0, 13) // 2)]


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration, drawn from ``seed``."""

    seed: int
    kind: str  # "token" (from_token_ids), "dense" (from_dense), "causal" or "full" (implicit)
    dtype: torch.dtype
    dim: int
    heads_q: int
    heads_kv: int
    q_len: int
    kv_len: int
    blocks: tuple[int, int]
    bshd: bool
    window: int | None  # token rule or causal
    ids_batch: int  # token rule: batch of the ids (1 broadcasts over the batch of 2)
    mask_heads: int  # dense: 1 or heads_q
    no_sm90: bool  # OMNI_HF_DISABLE_SM90=1 (the sm_80 kernels on Hopper)
    window_covers_groups: bool = False  # token rule: the window cuts image pairs too
    collator_ids: bool = False  # token rule: ids numbered as the collator does (packed_vlm_ids), else random ones

    @classmethod
    def draw(cls, seed: int) -> Case:
        """A block mask: from token ids for an even seed, from a dense mask for an odd one."""
        draw = drawer(seed)
        kv_len = draw_kv_len(draw)
        q_len = (kv_len, kv_len, 1, draw(1, kv_len))[draw(0, 3)]
        kind = ("token", "dense")[seed % 2]
        heads_kv = draw(1, 2)
        heads_q = heads_kv * (1, 4, 8)[draw(0, 2)]
        per_head = kind == "dense" and kv_len <= 2048 and draw(0, 1)  # [2, Hq, 4k, 4k] masks cost too much
        dtype, dim = (torch.float16, torch.bfloat16)[draw(0, 1)], (64, 96, 128)[draw(0, 2)]
        return cls(seed=seed, kind=kind, dtype=dtype, dim=dim, heads_q=heads_q, heads_kv=heads_kv, q_len=q_len,
                   kv_len=kv_len, blocks=BLOCKS[draw(0, 3)], bshd=bool(draw(0, 1)),
                   window=draw(1, kv_len) if kind == "token" and draw(0, 1) else None,
                   ids_batch=1 if kind == "token" and draw(0, 7) == 0 else 2, mask_heads=heads_q if per_head else 1,
                   no_sm90=bool(draw(0, 1)))._window_scope(draw)

    def _window_scope(self, draw: Callable[[int, int], int]) -> Case:
        """Half the windowed token-rule cases with the window over image pairs too (drawn after every other draw, so
        the rest of a seed's case stays what it was)."""
        return dataclasses.replace(self, window_covers_groups=self.window is not None and bool(draw(0, 1)))

    @classmethod
    def draw_windowed_groups(cls, seed: int) -> Case:
        """A token-rule mask whose window (1 to 400 keys) cuts image pairs too, ids as the collator numbers them for
        an even seed, random for an odd one."""
        draw = drawer(seed)
        kv_len = draw_kv_len(draw)
        heads_kv = draw(1, 2)
        return cls(seed=seed, kind="token", dtype=(torch.float16, torch.bfloat16)[draw(0, 1)],
                   dim=(64, 96, 128)[draw(0, 2)], heads_q=heads_kv * (1, 4, 8)[draw(0, 2)], heads_kv=heads_kv,
                   q_len=(kv_len, 1, draw(1, kv_len))[draw(0, 2)], kv_len=kv_len, blocks=BLOCKS[draw(0, 3)],
                   bshd=bool(draw(0, 1)), window=draw(1, 400), ids_batch=2, mask_heads=1, no_sm90=bool(draw(0, 1)),
                   window_covers_groups=True, collator_ids=seed % 2 == 0)

    @classmethod
    def draw_implicit(cls, seed: int) -> Case:
        """An implicit mask: causal for two seeds in three (windowed half the time), else full."""
        draw = drawer(seed)
        kv_len = draw_kv_len(draw)
        kind = ("causal", "causal", "full")[seed % 3]
        group = (1, 2, 4, 8, 16)[draw(0, 4)]
        q_len = min(kv_len, (kv_len, 1, draw(1, DECODE_ROWS // group), draw(2, 16), draw(1, kv_len))[draw(0, 4)])
        heads_kv = draw(1, 8 if q_len * group <= DECODE_ROWS else 2 if kv_len <= 2100 else 1)  # Hq <= 16 when long
        dtype, dim = (torch.float16, torch.bfloat16)[draw(0, 1)], (64, 96, 128, 64, 96, 128, 40, 80)[draw(0, 7)]
        return cls(seed=seed, kind=kind, dtype=dtype, dim=dim, heads_q=heads_kv * group, heads_kv=heads_kv,
                   q_len=q_len, kv_len=kv_len, blocks=BLOCKS[draw(0, 3)], bshd=bool(draw(0, 1)),
                   window=draw(1, kv_len) if kind == "causal" and draw(0, 1) else None, ids_batch=2, mask_heads=1,
                   no_sm90=bool(draw(0, 1)))

    def __str__(self) -> str:
        layout, path = "bshd" if self.bshd else "bhsd", "sm80" if self.no_sm90 else "auto"
        return (f"{self.seed:03d}-{self.kind}-{str(self.dtype)[6:]}-d{self.dim}-Hq{self.heads_q}-Hkv{self.heads_kv}-"
                f"q{self.q_len}-kv{self.kv_len}-blocks{self.blocks[0]}x{self.blocks[1]}-{layout}-window{self.window}-"
                f"ids{self.ids_batch}{'-collator' if self.collator_ids else ''}-maskheads{self.mask_heads}-{path}"
                + ("-windowcoversgroups" if self.window_covers_groups else ""))


def random_block_dense(case: Case, gen: torch.Generator) -> torch.Tensor:
    """bool [2, mask_heads, q_len, kv_len] on the GPU drawn per block as empty, full, the causal triangle
    (bottom-right aligned) or random bits of a random density, then a few runs of rows emptied."""
    (block_q, block_kv), heads, q_len, kv_len = case.blocks, case.mask_heads, case.q_len, case.kv_len
    shape = (2, heads, -(-q_len // block_q), -(-kv_len // block_kv))
    kind = torch.randint(0, 4, shape, generator=gen, device="cuda", dtype=torch.int8)
    density = torch.rand(shape, generator=gen, device="cuda") * 0.8 + 0.1

    def per_element(x):
        return x.repeat_interleave(block_q, 2)[:, :, :q_len].repeat_interleave(block_kv, 3)[..., :kv_len]

    kind, density = per_element(kind), per_element(density)
    rows, cols = torch.arange(q_len, device="cuda"), torch.arange(kv_len, device="cuda")
    causal = (rows[:, None] + kv_len - q_len) >= cols[None, :]
    bits = torch.rand(kind.shape, generator=gen, device="cuda") < density
    dense = (kind == 1) | ((kind == 2) & causal) | ((kind == 3) & bits)
    for _ in range(3):
        start, length = (int(torch.randint(0, n, (), generator=gen, device="cuda")) for n in (q_len, 200))
        dense[int(torch.randint(0, 2, (), generator=gen, device="cuda")), :, start:start + length + 1] = False
    return dense


def implicit_dense(case: Case) -> torch.Tensor:
    """bool [1, 1, q_len, kv_len] on the CPU of an implicit case, from position comparisons (not from the mask)."""
    if case.kind == "full":
        return torch.ones(1, 1, case.q_len, case.kv_len, dtype=torch.bool)
    return causal_dense(case.q_len, case.kv_len, case.window)[None, None]


def mask_of(case: Case, gen: torch.Generator) -> tuple[OmniBlockMask, torch.Tensor]:
    """The case's mask (block lists on the GPU) and its brute-force dense mask [B|1, H|1, q_len, kv_len] on the GPU."""
    block_q, block_kv = case.blocks
    if case.kind in ("causal", "full"):
        mask = (OmniBlockMask.full(case.q_len, case.kv_len, block_size=case.blocks) if case.kind == "full" else
                OmniBlockMask.causal(case.q_len, case.kv_len, block_size=case.blocks, window=case.window))
        return mask, implicit_dense(case).cuda()
    if case.kind == "dense":
        dense = random_block_dense(case, gen)
        return OmniBlockMask.from_dense(dense, block_size=(block_q, block_kv)), dense
    if case.collator_ids:
        doc, grp = packed_vlm_ids(2, case.kv_len, case.seed, doc_range=(40, 2000), image_range=(20, 600), gaps=True)
    else:
        doc, grp = random_token_ids(2, case.kv_len, case.seed)
    doc, grp = doc.cuda(), grp.cuda()
    doc = doc[:1] if case.ids_batch == 1 else doc
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=case.q_len, block_size=(block_q, block_kv),
                                        window=case.window, window_covers_groups=case.window_covers_groups)
    return mask, token_rule_dense(doc.expand(2, -1), grp, case.q_len, case.window, case.window_covers_groups)


def leaves(case: Case, gen: torch.Generator) -> list[torch.Tensor]:
    """Fresh random q, k, v, dout storage: [B, S, H, D] (BSHD) or [B, H, S, D], in the case's dtype."""
    def make(heads, length):
        shape = (2, length, heads, case.dim) if case.bshd else (2, heads, length, case.dim)
        return torch.randn(shape, generator=gen, device="cuda").to(case.dtype)

    return [make(case.heads_q, case.q_len), make(case.heads_kv, case.kv_len), make(case.heads_kv, case.kv_len),
            make(case.heads_q, case.q_len)]


def as_bhsd(case: Case, x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2) if case.bshd else x


def reference_run(q, k, v, dout, allowed, scale, dtype=None):
    """(out, lse, dq, dk, dv) of the reference under the dense mask, its inputs cast to ``dtype`` first."""
    q, k, v, dout = (x if dtype is None else x.to(dtype) for x in (q, k, v, dout))
    out, lse = reference.attention_forward(q, k, v, allowed, scale)
    return (out, lse, *reference.attention_backward(dout, q, k, v, out, lse, allowed, scale))


def write_log(line: str) -> None:
    path = os.environ.get("OMNI_HF_DIFF_LOG")
    if path:
        with open(path, "a") as log:
            log.write(line + "\n")


def kernel_and_references(case: Case, monkeypatch) -> tuple[list, tuple, tuple, torch.Tensor]:
    """Run the case: (out, lse, dq, dk, dv) of the kernels, of the reference in float64 and of the reference in the
    case's dtype (out and the gradients BHSD in the shapes of q, k, v; lse float32 [B, Hq, q_len]), and the dense mask
    bool [B|1, H|1, q_len, kv_len]."""
    monkeypatch.setenv("OMNI_HF_BACKEND", "cuda")
    if case.no_sm90:
        monkeypatch.setenv("OMNI_HF_DISABLE_SM90", "1")
    else:
        monkeypatch.delenv("OMNI_HF_DISABLE_SM90", raising=False)
    gen = torch.Generator(device="cuda").manual_seed(case.seed)
    mask, allowed = mask_of(case, gen)
    storage = leaves(case, gen)
    for x in storage[:3]:
        x.requires_grad_()
    q, k, v, dout = (as_bhsd(case, x) for x in storage)
    scale = case.dim ** -0.5

    out, lse = omni_attention(q, k, v, mask, scale=scale, return_lse=True)
    out.backward(dout)
    got = [out.detach(), lse, *(as_bhsd(case, x.grad) for x in storage[:3])]
    with torch.no_grad():
        gold = reference_run(q, k, v, dout, allowed, scale, torch.float64)
        same_dtype = reference_run(q, k, v, dout, allowed, scale)
    return got, gold, same_dtype, allowed


def check_case(case: Case, monkeypatch) -> None:
    """The kernels within the bounds of the float64 reference; exact zeros and -inf on rows with no key and on keys
    no query of their group sees; one log line."""
    got, gold, same_dtype, allowed = kernel_and_references(case, monkeypatch)
    expanded = allowed.expand(2, case.heads_q, -1, -1)
    empty = ~expanded.any(-1)
    unseen = ~expanded.unflatten(1, (case.heads_kv, -1)).any(2).any(-2)
    live = ~empty
    errors, bounds = {}, {}
    for name, index in (("out", 0), ("dq", 2), ("dk", 3), ("dv", 4)):
        errors[name] = relative_error(got[index], gold[index])
        bounds[name] = ROUNDINGS_BOUND * relative_error(same_dtype[index], gold[index])
    errors["lse"] = float((got[1][live] - gold[1][live]).abs().max()) if live.any() else 0.0
    bounds["lse"] = LSE_ATOL
    zeros = {"out": (got[0][empty] == 0).all(), "lse": torch.isneginf(got[1][empty]).all(),
             "dq": (got[2][empty] == 0).all(), "dk": (got[3][unseen] == 0).all(), "dv": (got[4][unseen] == 0).all()}
    zeros = {name: bool(ok) for name, ok in zeros.items()}
    finite = all(bool(torch.isfinite(x).all()) for x in (got[0], *got[2:])) and not bool(torch.isnan(got[1]).any())
    write_log(f"{case} empty_rows={int(empty.sum())} "
              + " ".join(f"{name}={errors[name]:.3e}/{bounds[name]:.3e}" for name in errors)
              + f" zeros={'ok' if all(zeros.values()) else [n for n, ok in zeros.items() if not ok]} finite={finite}")

    assert finite, "non-finite values in out, lse or a gradient"
    assert torch.equal(torch.isneginf(got[1]), empty), "rows with LSE -inf are not exactly the rows with no key"
    assert all(zeros.values()), f"not exactly zero on rows with no key / keys nobody sees: {zeros}"
    for name in errors:
        assert errors[name] <= bounds[name], f"{name}: error {errors[name]:.3e} > bound {bounds[name]:.3e}"


@pytest.mark.parametrize("case", [Case.draw(seed) for seed in range(CASES)], ids=str)
def test_cuda_kernels_match_float64_reference_on_random_masks(case, monkeypatch):
    check_case(case, monkeypatch)


@pytest.mark.parametrize("case", [Case.draw_implicit(seed) for seed in range(CASES, CASES + IMPLICIT_CASES)], ids=str)
def test_cuda_kernels_match_float64_reference_on_implicit_masks(case, monkeypatch):
    check_case(case, monkeypatch)


@pytest.mark.parametrize("case", [Case.draw_windowed_groups(seed) for seed in range(
    CASES + IMPLICIT_CASES, CASES + IMPLICIT_CASES + WINDOWED_GROUP_CASES)], ids=str)
def test_cuda_kernels_match_float64_reference_with_the_window_over_image_pairs(case, monkeypatch):
    check_case(case, monkeypatch)
