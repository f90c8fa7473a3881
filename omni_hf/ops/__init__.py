"""The op: `omni_attention` (checks, dispatch, autograd; `attention`), the CUDA library it dispatches to (`library`:
flat tensors in, never the mask class) and the exact PyTorch reference (`reference`)."""

from .attention import omni_attention

__all__ = ["omni_attention"]
