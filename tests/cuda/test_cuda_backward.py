"""GPU tests of the CUDA backward (dQ, dK, dV) against the exact reference.

Every case draws fresh random inputs, takes out / lse from the reference forward in the inputs' dtype
(so the backward is tested on its own), and compares each gradient with the float64 reference by
||g - gold|| / ||gold||. The bound is derived, not picked: the reference run in the same dtype (fp32
accumulation, outputs rounded to the dtype) has an error e_ref against float64; the kernel also rounds
P and dS to the dtype before its tensor-core GEMMs, two more roundings of the same size, so it must stay
within 4 * e_ref (sqrt(3) for three equal independent roundings, with margin). Where dS cancels (a row with a
single allowed key has dP = D exactly, so its dq is zero in exact arithmetic) the reference's own sums cancel
too, so e_ref can be 0; the kernel computes dP (tensor cores) and D (the preprocess) as two fp32 sums of D
products in different orders, and the bound adds their derived rounding floor (_rounding_floor). Gradients the
mask makes zero by its structure (rows with no allowed key, keys no query of the group sees) must be exactly zero.

On a Hopper GPU each test runs twice: through the sm_90a main kernel (which takes 128-key mask blocks and
falls back to sm_80 for the rest) and with OMNI_HF_DISABLE_SM90=1, through the sm_80 kernel.

Skipped (never failed) without a CUDA device or the library. Run one small case standalone, e.g. under
compute-sanitizer: ``python -m tests.cuda.test_cuda_backward``.
"""

from __future__ import annotations

import pytest
import torch

from omni_hf.mask import RANGE_INEXACT, OmniBlockMask
from omni_hf.ops import library, reference
from tests.helpers.brute_force import without_ranges
from tests.helpers.gpu_paths import is_hopper, kernel_names

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernel_path")]

ROUNDINGS_BOUND = 4.0  # kernel error / same-dtype reference error (see the module docstring)


@pytest.fixture(autouse=True)
def poisoned_outputs():
    """The op fills dq, dk, dv and its workspace with NaN before the kernels run; the checks then prove every
    element was written (they compare all of them and require finite values)."""
    library.set_poison_outputs(True)
    yield
    library.set_poison_outputs(False)


# ---------------------------------------------------------------------------------------------- inputs


def _qkv(batch, heads_q, heads_kv, q_len, kv_len, dim, dtype, *, bshd=False, gen):
    """Random q, k, v, dout; with bshd, each is a transposed [B, S, H, D] buffer (Transformers' layout)."""

    def rand(heads, length):
        if bshd:
            return torch.randn(batch, length, heads, dim, generator=gen, device="cuda").to(dtype).transpose(1, 2)
        return torch.randn(batch, heads, length, dim, generator=gen, device="cuda").to(dtype)

    return rand(heads_q, q_len), rand(heads_kv, kv_len), rand(heads_kv, kv_len), rand(heads_q, q_len)


def _block_mixture(batch, heads, q_len, kv_len, block_q, block_kv, *, gen) -> torch.Tensor:
    """Dense bool [batch, heads, q_len, kv_len] mask drawn block by block: all, none, causal (bottom-right
    aligned) or a random pattern, so from_dense yields every block type (FULL, MASKED, CAUSAL, PARTIAL)."""
    qpos = torch.arange(q_len, device="cuda")[:, None] + (kv_len - q_len)
    causal = qpos >= torch.arange(kv_len, device="cuda")[None, :]
    n_q, n_kv = -(-q_len // block_q), -(-kv_len // block_kv)
    kind = torch.randint(0, 4, (batch, heads, n_q, n_kv), generator=gen, device="cuda")
    kind = kind.repeat_interleave(block_q, 2)[:, :, :q_len].repeat_interleave(block_kv, 3)[..., :kv_len]
    noise = torch.rand(batch, heads, q_len, kv_len, generator=gen, device="cuda") < 0.5
    return torch.where(kind == 0, True, torch.where(kind == 1, False, torch.where(kind == 2, causal, noise)))


def _token_ids(batch, kv_len, *, seed) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed documents with interleaved images: doc ids (padding -1 at the end) and group ids (-1 = text)."""
    gen = torch.Generator().manual_seed(seed)

    def draw(low, high):
        return int(torch.randint(low, high, (1,), generator=gen))

    doc = torch.empty(batch, kv_len, dtype=torch.int32)
    grp = torch.full((batch, kv_len), -1, dtype=torch.int32)
    group = 0
    for b in range(batch):
        start, d = 0, 0
        while start < kv_len:
            end = min(start + draw(1, max(2, kv_len // 2)), kv_len)
            doc[b, start:end] = d
            img = start + draw(0, 96)
            while img < end:  # images inside the document, text runs between them
                size = draw(1, 80)
                grp[b, img:min(img + size, end)] = group
                group += 1
                img += size + draw(1, 96)
            start, d = end, d + 1
        pad = draw(0, kv_len // 8 + 1)
        doc[b, kv_len - pad:] = -1
    return doc.cuda(), grp.cuda()


# ---------------------------------------------------------------------------------------------- checks


def _gold_and_reference(dout, q, k, v, mask, scale, softcap):
    """(float64 gradients, float64 lse, same-dtype reference gradients, out, lse of the same-dtype reference
    forward)."""
    up = [t.double() for t in (dout, q, k, v)]
    out64, lse64 = reference.attention_forward(*up[1:], mask, scale, softcap)
    gold = reference.attention_backward(up[0], *up[1:], out64, lse64, mask, scale, softcap)
    out, lse = reference.attention_forward(q, k, v, mask, scale, softcap)
    ref = reference.attention_backward(dout, q, k, v, out, lse, mask, scale, softcap)
    return gold, lse64, ref, out, lse


def _structural_zeros(allowed: torch.Tensor, batch: int, heads_q: int, heads_kv: int):
    """Rows of dq with no allowed key, and rows of dk / dv whose key no query of the group sees (``allowed``: the
    mask as a dense bool tensor): their gradients are exactly zero by the mask's structure (a single allowed key
    also gives a zero gradient mathematically, but only up to rounding)."""
    dense = allowed.expand(batch, heads_q, -1, -1)
    no_key = ~dense.any(-1)
    no_query = ~dense.unflatten(1, (heads_kv, heads_q // heads_kv)).any(2).any(-2)
    return no_key, no_query, no_query


def _rounding_floor(dout, q, k, v, allowed, scale, softcap, lse) -> tuple[float, float, float]:
    """||floor|| of dq, dk, dv: the fp32 rounding of dS = P (dP - D) where dP = dO.v and D = dO.o are summed
    separately over the head dim (n products each, error up to n * 2^-24 * |dO|.|v| apiece, the standard bound of
    a dot product), carried into dq = scale * dS k and dk = scale * dS^T q through |k| and |q| (the softcap's
    derivative is at most 1). dv = P^T dO has no such cancellation: 0. allowed: the dense mask; lse: the float64
    forward's."""
    dout64, q64, k64, v64 = (t.double() for t in (dout, q, k, v))
    group = q.shape[1] // k.shape[1]
    k_e, v_e = (t.repeat_interleave(group, dim=1) for t in (k64, v64))
    t = scale * q64 @ k_e.transpose(-1, -2)
    if softcap:
        t = softcap * torch.tanh(t / softcap)
    p = torch.where(allowed.expand_as(t), torch.exp(t - lse[..., None]),
                    torch.zeros((), dtype=t.dtype, device=t.device))
    e = p * (dout64.abs() @ v_e.abs().transpose(-1, -2)) * 2 * q.shape[-1] * 2.0**-24
    dq_floor = scale * e @ k_e.abs()
    dk_floor = (scale * e.transpose(-1, -2) @ q64.abs()).unflatten(1, (k.shape[1], group)).sum(2)
    return float(dq_floor.norm()), float(dk_floor.norm()), 0.0


def _assert_gradients(got, gold, ref, zeros, floors):
    for name, g, exact, lo, zero, floor in zip(("dq", "dk", "dv"), got, gold, ref, zeros, floors):
        assert g.shape == exact.shape and g.dtype == lo.dtype, name
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        assert (g[zero] == 0).all(), f"{name}: rows the mask leaves empty are not exactly zero"
        norm = float(exact.norm())
        err, bound = float((g.double() - exact).norm()), ROUNDINGS_BOUND * float((lo.double() - exact).norm()) + floor
        print(f"{name}: error {err:.2e} (norm {norm:.2e}), bound {bound:.2e} (fp32 rounding floor {floor:.2e})")
        assert err <= bound, f"{name}: error {err:.2e} > {bound:.2e} (the gradient's norm is {norm:.2e})"


def _check(dout, q, k, v, mask, *, scale=None, softcap=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask = mask.to("cuda")
    gold, lse64, ref, out, lse = _gold_and_reference(dout, q, k, v, mask, scale, softcap)
    got = library.backward(dout, q, k, v, out, lse, *mask.as_tuple(), scale, softcap)
    allowed = mask.to_dense("cuda")
    _assert_gradients(got, gold, ref, _structural_zeros(allowed, q.shape[0], q.shape[1], k.shape[1]),
                      _rounding_floor(dout, q, k, v, allowed, scale, softcap, lse64))


# ---------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    "dtype, dim, block_q, block_kv, heads_q, heads_kv, q_len, kv_len, mask_heads",
    [
        (torch.bfloat16, 128, 128, 128, 4, 1, 300, 300, "all"),
        (torch.float16, 128, 64, 128, 8, 1, 200, 333, "one"),
        (torch.bfloat16, 64, 128, 64, 2, 2, 257, 190, "all"),
        (torch.float16, 64, 64, 64, 4, 1, 129, 129, "all"),
        (torch.bfloat16, 128, 64, 64, 8, 2, 64, 700, "one"),
        (torch.float16, 128, 128, 64, 2, 1, 511, 513, "all"),
        (torch.bfloat16, 64, 64, 128, 4, 4, 1000, 1000, "one"),
        (torch.bfloat16, 256, 128, 128, 4, 2, 300, 333, "all"),
        (torch.float16, 256, 64, 128, 2, 1, 513, 190, "one"),
        (torch.bfloat16, 512, 128, 128, 4, 2, 300, 333, "all"),
        (torch.float16, 512, 64, 64, 2, 1, 513, 190, "one"),
    ],
)
def test_gradients_match_reference_on_random_block_type_mixtures(dtype, dim, block_q, block_kv, heads_q, heads_kv,
                                                                  q_len, kv_len, mask_heads):
    gen = torch.Generator("cuda").manual_seed(q_len * 7919 + kv_len)
    q, k, v, dout = _qkv(2, heads_q, heads_kv, q_len, kv_len, dim, dtype, gen=gen)
    dense = _block_mixture(2, heads_q if mask_heads == "all" else 1, q_len, kv_len, block_q, block_kv, gen=gen)
    _check(dout, q, k, v, OmniBlockMask.from_dense(dense, block_size=(block_q, block_kv)))


@pytest.mark.parametrize("dtype, dim", [(torch.bfloat16, 128), (torch.float16, 64), (torch.bfloat16, 256),
                                        (torch.float16, 96), (torch.bfloat16, 512)])
@pytest.mark.parametrize("window, covers", [(None, False), (100, False), (40, True)])
def test_gradients_match_reference_under_the_token_rule(dtype, dim, window, covers):
    """Also with the window (40) over image pairs too."""
    gen = torch.Generator("cuda").manual_seed(11 + (window or 0))
    q_len = kv_len = 900
    q, k, v, dout = _qkv(2, 8, 2, q_len, kv_len, dim, dtype, gen=gen)
    doc, grp = _token_ids(2, kv_len, seed=11 + (window or 0))
    _check(dout, q, k, v, OmniBlockMask.from_token_ids(doc, grp, block_size=128, window=window,
                                                       window_covers_groups=covers))


@pytest.mark.parametrize("window, covers", [(None, False), (200, False), (40, True)])
@pytest.mark.parametrize("dim", [96, 128, 256])
def test_token_ranges_give_the_gradients_of_the_ids(window, covers, dim):
    """The sm_90a backward tests the keys' token_ranges where a batch row's ids allow it (row 0; row 1 reuses
    document 0 and compares ids): gradients match the reference, and dk, dv (summed in registers, in a fixed order)
    equal bit for bit those of the same mask without ranges (dq is summed by reductions in any order)."""
    gen = torch.Generator("cuda").manual_seed(17)
    q, k, v, dout = _qkv(2, 8, 2, 1100, 1100, dim, torch.bfloat16, gen=gen)
    doc, grp = _token_ids(2, 1100, seed=17)
    doc[1, 800:900] = 0
    mask = OmniBlockMask.from_token_ids(doc, grp, block_size=128, window=window, window_covers_groups=covers)
    assert (mask.token_rule.ranges[0] != RANGE_INEXACT).all() and (mask.token_rule.ranges[1] == RANGE_INEXACT).all()
    _check(dout, q, k, v, mask)
    scale = q.shape[-1] ** -0.5
    out, lse = reference.attention_forward(q, k, v, mask, scale, None)
    _, *dkv_ranges = library.backward(dout, q, k, v, out, lse, *mask.as_tuple(), scale, None)
    _, *dkv_ids = library.backward(dout, q, k, v, out, lse, *without_ranges(mask).as_tuple(), scale, None)
    assert all(torch.equal(a, b) for a, b in zip(dkv_ranges, dkv_ids))


def test_token_rule_ids_broadcast_over_the_batch():
    gen = torch.Generator("cuda").manual_seed(5)
    q, k, v, dout = _qkv(3, 4, 1, 400, 400, 64, torch.bfloat16, gen=gen)
    doc, grp = _token_ids(1, 400, seed=5)
    _check(dout, q, k, v, OmniBlockMask.from_token_ids(doc, grp, block_size=(64, 128)))


@pytest.mark.parametrize("q_len", [1, 63, 200])
@pytest.mark.parametrize("block_q, block_kv", [(128, 128), (64, 64)])
def test_causal_with_fewer_queries_than_keys_is_bottom_right_aligned(q_len, block_q, block_kv):
    gen = torch.Generator("cuda").manual_seed(q_len)
    q, k, v, dout = _qkv(1, 4, 4, q_len, 1031, 128, torch.float16, gen=gen)
    _check(dout, q, k, v, OmniBlockMask.causal(q_len, 1031, block_size=(block_q, block_kv)))


@pytest.mark.parametrize("length, dtype, dim", [(4100, torch.bfloat16, 128), (4097, torch.float16, 64),
                                               (4100, torch.bfloat16, 256), (4099, torch.bfloat16, 96)])
def test_long_sequences_with_tails(length, dtype, dim):
    gen = torch.Generator("cuda").manual_seed(length)
    q, k, v, dout = _qkv(1, 2, 1, length, length, dim, dtype, gen=gen)
    doc, grp = _token_ids(1, length, seed=length)
    _check(dout, q, k, v, OmniBlockMask.from_token_ids(doc, grp, block_size=128))


@pytest.mark.parametrize("softcap", [5.0, 30.0])
@pytest.mark.parametrize("dim", [96, 128, 256, 512])
def test_softcap_gradients(softcap, dim):
    gen = torch.Generator("cuda").manual_seed(int(softcap))
    q, k, v, dout = _qkv(2, 4, 2, 333, 333, dim, torch.bfloat16, gen=gen)
    q = (q.float() * 3).to(q.dtype)  # large scores, so the cap bends them
    dense = _block_mixture(1, 1, 333, 333, 64, 128, gen=gen)
    _check(dout, q, k, v, OmniBlockMask.from_dense(dense, block_size=(64, 128)), scale=0.2, softcap=softcap)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_transposed_bshd_inputs(dtype):
    gen = torch.Generator("cuda").manual_seed(3)
    q, k, v, dout = _qkv(2, 8, 2, 259, 259, 128, dtype, bshd=True, gen=gen)
    assert not q.is_contiguous() and q.stride(-1) == 1
    _check(dout, q, k, v, OmniBlockMask.causal(259, block_size=(64, 128)))


@pytest.mark.parametrize("block", [64, 128])
def test_fully_masked_rows_and_unseen_keys_get_exactly_zero_gradient(block):
    gen = torch.Generator("cuda").manual_seed(17)
    q, k, v, dout = _qkv(1, 4, 2, 300, 280, 64, torch.bfloat16, gen=gen)
    dense = torch.rand(1, 4, 300, 280, generator=gen, device="cuda") < 0.3
    dense[:, :, 40:170] = False  # whole query blocks with no key
    dense[:, :, :, 200:] = False  # keys nobody sees, including the tail
    _check(dout, q, k, v, OmniBlockMask.from_dense(dense, block_size=block))


@pytest.mark.parametrize("block_kv", [64, 128])
@pytest.mark.parametrize("dim", [96, 128, 256, 512])
def test_every_gradient_element_is_written_over_poisoned_outputs_and_workspace(block_kv, dim):
    gen = torch.Generator("cuda").manual_seed(block_kv)
    q, k, v, dout = _qkv(2, 4, 2, 190, 250, dim, torch.bfloat16, gen=gen)
    _check(dout, q, k, v, OmniBlockMask.from_dense(_block_mixture(2, 4, 190, 250, 64, block_kv, gen=gen),
                                                   block_size=(64, block_kv)))


@pytest.mark.parametrize("window", [None, 1, 150])
@pytest.mark.parametrize("q_len, kv_len", [(1, 700), (200, 1031), (513, 513)])
@pytest.mark.parametrize("block_q, block_kv, dim", [(128, 128, 128), (64, 64, 128), (64, 128, 128), (128, 128, 256),
                                                    (128, 128, 96), (64, 64, 96), (128, 128, 512), (64, 64, 512)])
def test_implicit_causal_mask_gradients(block_q, block_kv, dim, q_len, kv_len, window):
    """Implicit causal masks (no lists): the backward derives every column's blocks, windows included."""
    gen = torch.Generator("cuda").manual_seed(q_len + kv_len + (window or 0))
    q, k, v, dout = _qkv(2, 4, 2, q_len, kv_len, dim, torch.bfloat16, gen=gen)
    _check(dout, q, k, v, OmniBlockMask.causal(q_len, kv_len, window=window, block_size=(block_q, block_kv)))


@pytest.mark.parametrize("q_len, kv_len", [(1, 700), (700, 300), (513, 513)])
def test_implicit_full_mask_gradients(q_len, kv_len):
    gen = torch.Generator("cuda").manual_seed(q_len * 5 + kv_len)
    q, k, v, dout = _qkv(2, 4, 1, q_len, kv_len, 64, torch.float16, gen=gen)
    _check(dout, q, k, v, OmniBlockMask.full(q_len, kv_len))


def test_backward_outputs_keep_the_layout_of_their_inputs():
    gen = torch.Generator("cuda").manual_seed(4)
    q, k, v, dout = _qkv(2, 8, 2, 300, 300, 64, torch.bfloat16, bshd=True, gen=gen)
    out, lse = reference.attention_forward(q, k, v, OmniBlockMask.causal(300), 0.125)
    grads = library.backward(dout, q, k, v, out, lse, *OmniBlockMask.causal(300).as_tuple(), 0.125, None)
    for grad, t in zip(grads, (q, k, v)):
        assert grad.stride() == library.output_strides(t) and grad.transpose(1, 2).is_contiguous()


def test_library_errors_name_the_failed_check():
    gen = torch.Generator("cuda").manual_seed(1)
    # head dim 76: not a multiple of 8 (the op refuses it first); checked before the tensors' strides
    q, k, v, dout = (t[..., :76] for t in _qkv(1, 2, 1, 128, 128, 80, torch.float16, gen=gen))
    mask = OmniBlockMask.causal(128, block_size=64)
    out, lse = reference.attention_forward(q, k, v, mask, 0.125)
    with pytest.raises(RuntimeError, match="omni_bwd failed: head_dim.*head_dim=76; expected a multiple of 8"):
        library.backward(dout, q, k, v, out, lse, *mask.as_tuple(), 0.125, None)


@pytest.mark.skipif(not is_hopper(), reason="needs a compute capability 9.0 GPU")
@pytest.mark.parametrize("dim", [64, 96, 128, 256])
def test_hopper_main_kernel_takes_128_key_blocks_and_the_switch_turns_it_off(kernel_path, dim):
    """The sm_90a main kernel runs for block_kv = 128 on Hopper (any block_q) at every head dim it is built for;
    block_kv = 64 and the switch fall back to sm_80's."""
    gen = torch.Generator("cuda").manual_seed(3)
    q, k, v, dout = _qkv(1, 2, 1, 300, 300, dim, torch.bfloat16, gen=gen)
    out, lse = reference.attention_forward(q, k, v, OmniBlockMask.causal(300, 300), 0.125)

    def main_kernels(block_q, block_kv):
        mask = OmniBlockMask.causal(300, 300, block_size=(block_q, block_kv))
        names = kernel_names(lambda: library.backward(dout, q, k, v, out, lse, *mask.as_tuple(), 0.125, None), "bwd")
        return [n for n in names if "preprocess" not in n and "convert" not in n]

    for block_q in (64, 128):
        names = main_kernels(block_q, 128)
        assert len(names) == 1 and ("sm90::" in names[0]) == (kernel_path == "sm90"), names
    names = main_kernels(128, 64)
    assert len(names) == 1 and "sm90::" not in names[0], names


# Small cases (every block type, both block sizes, the token rule, a window) for compute-sanitizer.
if __name__ == "__main__":
    import sys

    dims = [int(arg) for arg in sys.argv[1:]] or [96, 128, 256]  # head dims: the arguments, if any
    for dim in dims:
        for block in (64, 128):
            test_every_gradient_element_is_written_over_poisoned_outputs_and_workspace(block, dim)
        test_gradients_match_reference_under_the_token_rule(torch.bfloat16, dim, 100)
        test_token_ranges_give_the_gradients_of_the_ids(200, dim)
    test_token_rule_ids_broadcast_over_the_batch()
    print("ok")


def _deterministic_case_mask(kind: str, q_len: int, kv_len: int, *, gen) -> OmniBlockMask:
    """The masks of the deterministic tests: every way a backward CTA finds its Q tiles (block lists of both block
    sizes, the token rule, the implicit kinds with and without a window)."""
    if kind == "token":
        doc, grp = _token_ids(2, kv_len, seed=q_len)
        return OmniBlockMask.from_token_ids(doc, grp, block_size=128, q_len=q_len)
    if kind.startswith("blocks"):
        block = int(kind.removeprefix("blocks"))
        return OmniBlockMask.from_dense(_block_mixture(2, 1, q_len, kv_len, block, block, gen=gen), block_size=block)
    if kind == "causal_window":
        return OmniBlockMask.causal(q_len, kv_len, window=300)
    return OmniBlockMask.full(q_len, kv_len)


@pytest.mark.parametrize("dim", [64, 128, 256, 512])
@pytest.mark.parametrize("kind", ["token", "blocks128", "blocks64", "causal_window", "full"])
def test_deterministic_backward_repeats_bitwise_and_matches_the_definition(dim, kind, kernel_path):
    """``deterministic=True``: ten backwards of one call give bitwise-equal dq, dk, dv (the CTAs adding into a dQ
    tile take turns), and they match the float64 definition like every other backward. B 2, 8 / 2 heads, 700
    queries over 1000 keys (bottom-right aligned), crossing the 64- and 128-row tiles and the key blocks (and, on
    the sm_80 kernels at head dims above 128, the 64- and 32-key tiles that split one block), on both kernel
    families."""
    gen = torch.Generator("cuda").manual_seed(dim * 31 + len(kind))
    q_len, kv_len = 700, 1000
    q, k, v, dout = _qkv(2, 8, 2, q_len, kv_len, dim, torch.bfloat16, gen=gen)
    mask = _deterministic_case_mask(kind, q_len, kv_len, gen=gen).to("cuda")
    scale = dim**-0.5
    gold, lse64, ref, out, lse = _gold_and_reference(dout, q, k, v, mask, scale, None)
    runs = [library.backward(dout, q, k, v, out, lse, *mask.as_tuple(), scale, None, deterministic=True)
            for _ in range(10)]
    for run in runs[1:]:
        for name, first, again in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(first, again), f"{name} differs between runs"
    allowed = mask.to_dense("cuda")
    _assert_gradients(runs[0], gold, ref, _structural_zeros(allowed, 2, 8, 2),
                      _rounding_floor(dout, q, k, v, allowed, scale, None, lse64))


@pytest.mark.parametrize("dim", [64, 512])
def test_a_deterministic_grid_of_more_ctas_than_fit_at_once_finishes_and_repeats(dim, kernel_path):
    """A deterministic CTA waits only for lower key tiles of its own heads, which the grid launches first, so a grid
    many times what the GPU holds at once neither hangs nor varies. Causal over 8192 tokens, B 2, 8 / 8 heads: 1024
    CTAs of 128 keys at head dim 64, 4096 of 32 keys at 512 (sm_80 kernels). Three runs are bitwise equal and
    within bf16 summation noise of the default backward (whose accuracy the tests above bound)."""
    gen = torch.Generator("cuda").manual_seed(dim)
    q, k, v, dout = _qkv(2, 8, 8, 8192, 8192, dim, torch.bfloat16, gen=gen)
    mask = OmniBlockMask.causal(8192, 8192).to("cuda")
    scale = dim**-0.5
    out, lse = library.forward(q, k, v, *mask.as_tuple(), scale, None)
    default = library.backward(dout, q, k, v, out, lse, *mask.as_tuple(), scale, None)
    runs = [library.backward(dout, q, k, v, out, lse, *mask.as_tuple(), scale, None, deterministic=True)
            for _ in range(3)]
    for run in runs[1:]:
        for name, first, again in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(first, again), f"{name} differs between runs"
    for name, det, plain in zip(("dq", "dk", "dv"), runs[0], default):
        assert torch.isfinite(det).all(), name
        err = float((det.float() - plain.float()).norm() / plain.float().norm())
        assert err < 1e-2, f"{name}: {err:.2e} from the default backward"  # bf16 gradients summed in other orders


def test_deterministic_algorithms_make_every_gradient_repeat_bitwise_sinks_and_broadcast_bias_included(kernel_path):
    """Under ``torch.use_deterministic_algorithms(True)``, a call with sinks and a bias broadcast over the batch (whose
    gradients the default backward adds with atomics) gives bitwise-equal gradients of q, k, v, the sinks and the
    bias over ten runs, and the same gradients as the default backward up to the order of its sums, on both kernel
    families."""
    from omni_hf import omni_attention

    gen = torch.Generator("cuda").manual_seed(5)
    q, k, v, dout = _qkv(2, 4, 2, 600, 600, 128, torch.bfloat16, gen=gen)
    sinks = torch.randn(4, generator=gen, device="cuda")
    bias = torch.randn(1, 4, 600, 600, generator=gen, device="cuda").to(torch.bfloat16)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks, bias)]
    mask = _deterministic_case_mask("token", 600, 600, gen=gen).to("cuda")

    def grads():
        out = omni_attention(*leaves[:3], mask, sinks=leaves[3], bias=leaves[4])
        return torch.autograd.grad(out, leaves, dout)

    default = grads()
    state = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        runs = [grads() for _ in range(10)]
    finally:
        torch.use_deterministic_algorithms(state[0], warn_only=state[1])
    names = ("dq", "dk", "dv", "dsinks", "dbias")
    for run in runs[1:]:
        for name, first, again in zip(names, runs[0], run):
            assert torch.equal(first, again), f"{name} differs between runs"
    for name, det, plain in zip(names, runs[0], default):
        assert det.shape == plain.shape and det.dtype == plain.dtype, name
        err = float((det.float() - plain.float()).norm() / plain.float().norm())
        assert err < 1e-2, f"{name}: {err:.2e} from the default backward"  # bf16 gradients summed in other orders
