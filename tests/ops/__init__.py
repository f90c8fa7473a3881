"""omni_attention: checks, dispatch, autograd and the exact reference."""
