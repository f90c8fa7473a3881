"""Models of the Transformers integration tests: omni and its reference on one set of weights, padding masks, and
the comparison of their outputs and gradients (float32 to 1e-5; bf16 within twice the reference's own bf16 error)."""

from __future__ import annotations

import re

import torch

from tests.helpers.brute_force import relative_error

KEY_BIAS = re.compile(r"\b(k_proj|key)\.bias$")


def low_precision(device: torch.device) -> bool:
    return device.type == "cuda"


def assert_close_to_reference(actual, expected, lowp_reference=None, what="output"):
    """float32: relative error under 1e-5. bf16: at most twice the reference implementation's own bf16 error."""
    error = relative_error(actual, expected)
    bound = 1e-5 if lowp_reference is None else 2 * relative_error(lowp_reference, expected)
    assert error <= bound, f"{what}: relative error {error:.2e} > {bound:.2e}"  # both 0 when exact


def models(build, device, reference="eager"):
    """The omni model (bf16 on a GPU), the reference implementation in float32 and, on a GPU, in bf16; one set
    of random weights (seed 0). ``build(attn)`` must give each model its own config (Transformers writes the
    implementation into the config object)."""
    torch.manual_seed(0)
    ref = build(reference).to(device).eval()
    # float32 models are not cast: Module.to(dtype) casts complex buffers too, dropping their imaginary part (the
    # rotary frequencies of Llama 4's vision tower)
    omni = build("omni").to(device).eval()
    lowp = build(reference).to(device).eval() if low_precision(device) else None
    if low_precision(device):
        omni, lowp = omni.to(torch.bfloat16), lowp.to(torch.bfloat16)
    for model, attn in ((ref, reference), (omni, "omni"), (lowp, reference)):
        if model is not None:
            model.load_state_dict(ref.state_dict())
            assert model.config._attn_implementation == attn
    return omni, ref, lowp


def padding(lengths, seq_len, left, device="cpu"):
    """int [B, seq_len] attention mask with ``lengths`` real tokens per row, padded on the left or right."""
    mask = (torch.arange(seq_len)[None] < torch.tensor(lengths)[:, None]).long()
    return (mask.flip(-1) if left else mask).to(device)


def joined_key_bias(grads: dict, name: str) -> torch.Tensor:
    """The gradient of ``name`` to compare. Key biases get none (a row's attention scores all shift by q.b, which
    softmax ignores), so theirs is rounding noise (~1e-9 here): it is compared joined to its weight's gradient."""
    if not KEY_BIAS.search(name):
        return grads[name]
    return torch.cat([grads[name.removesuffix("bias") + "weight"].flatten(), grads[name]])
