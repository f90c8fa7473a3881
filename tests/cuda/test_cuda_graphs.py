"""CUDA graphs and compiled decoding with omni (GPU only; skipped without CUDA or the library).

Nothing on omni's path may sync with the host or allocate outside torch's allocator, so a whole training step
(the token-rule mask build, forward and backward) captures into one CUDA graph and its replays compute what eager
calls compute on the same inputs; and Transformers' static-cache generation compiled with CUDA graphs runs.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.measure import capture_graph
from omni_hf import OmniBlockMask, omni_attention
from tests.helpers.brute_force import relative_error

pytestmark = pytest.mark.gpu

# Gradients that go through dQ differ between two runs by the order of its fp32 atomic sums, a few bf16 roundings
# flipped among thousands of elements; a stale buffer or a wrong mask in a replay would be off by O(1).
ATOMIC_ORDER_BOUND = 1e-2


def random_ids(length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """doc / group ids int32 [2, length]: two packed documents per row, an image in each, some padding."""
    doc = torch.full((2, length), -1, dtype=torch.int32)
    grp = torch.full((2, length), -1, dtype=torch.int32)
    for row in range(2):
        cut, end = (int(x) for x in torch.randint(length // 4, length // 2, (2,), generator=gen))
        end = length - end // 4
        doc[row, :cut], doc[row, cut:end] = 0, 1
        start = int(torch.randint(0, cut - 40, (1,), generator=gen))
        grp[row, start:start + 40] = 0
    return doc, grp


@pytest.mark.parametrize("mask_kind", ["token_rule", "causal"])
def test_captured_attention_step_with_its_mask_build_replays_like_eager_calls(mask_kind):
    gen = torch.Generator().manual_seed(0)
    shape = (2, 8, 700, 64)
    q, k, v, dout = (torch.randn(*shape[:1], 8 if i in (0, 3) else 2, *shape[2:], generator=gen).cuda()
                     .to(torch.bfloat16) for i in range(4))
    doc, grp = (t.cuda() for t in random_ids(700, gen))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def step():
        mask = (OmniBlockMask.from_token_ids(doc, grp) if mask_kind == "token_rule"
                else OmniBlockMask.causal(700, window=200))
        out = omni_attention(*leaves, mask)
        return (out, *torch.autograd.grad(out, leaves, dout))

    graph, captured = capture_graph(step)
    for seed in (1, 2):  # new inputs written into the captured buffers, then replayed
        fresh = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for t in (*leaves, dout):
                t.copy_(torch.randn(t.shape, generator=fresh).to(t.dtype))
            new_doc, new_grp = random_ids(700, fresh)
            doc.copy_(new_doc)
            grp.copy_(new_grp)
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, eager):
            assert torch.isfinite(got).all(), name
            # dq is summed over key blocks in fp32 by atomics (any order), then rounded: equal up to that order
            bound = ATOMIC_ORDER_BOUND if name == "dq" else 0.0
            assert relative_error(got, want) <= bound, f"{name}: replay differs from the eager call"


def test_captured_transformers_training_step_replays_like_eager():
    """A tiny Llama's forward, loss and backward with packed omni ids, captured whole; each replay's loss and
    gradients equal an eager step's on the same inputs."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="omni").cuda().to(torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, 100, (2, 300), generator=gen).cuda()
    doc, grp = (t.cuda() for t in random_ids(300, gen))
    labels = input_ids.masked_fill(doc < 0, -100)
    params = [p for p in model.parameters()]

    def step():
        loss = model(input_ids=input_ids, labels=labels, omni_doc_ids=doc, omni_group_ids=grp).loss
        return (loss, *torch.autograd.grad(loss, params))

    graph, captured = capture_graph(step)
    fresh = torch.Generator().manual_seed(4)
    input_ids.copy_(torch.randint(0, 100, (2, 300), generator=fresh))
    new_doc, new_grp = random_ids(300, fresh)
    doc.copy_(new_doc)
    grp.copy_(new_grp)
    labels.copy_(input_ids.masked_fill(doc < 0, -100))
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    assert relative_error(captured[0], eager[0]) == 0, "loss"  # the forward has no atomics: bit-equal
    for got, want in zip(captured[1:], eager[1:]):
        assert torch.isfinite(got).all()
        assert relative_error(got, want) <= ATOMIC_ORDER_BOUND


def test_static_cache_generation_compiled_with_cuda_graphs_gives_eager_tokens():
    """generate() compiles the decoding step (mode reduce-overhead) for a static cache; omni inside it must trace
    without a graph break or sync, and decode the tokens eager omni decodes with the same cache."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="omni").cuda().eval()
    model = model.to(torch.bfloat16)
    prompts = torch.randint(3, 100, (2, 40), generator=torch.Generator().manual_seed(5)).cuda()
    settings = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0,
                    attention_mask=torch.ones_like(prompts), cache_implementation="static")
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model.generate(prompts, disable_compile=True, **settings)
        compiled = model.generate(prompts, **settings)
        again = model.generate(prompts, **settings)  # replays the captured graphs
    assert torch.equal(compiled, eager) and torch.equal(again, eager)


def test_static_cache_decoding_compiled_without_inductor_gives_eager_logits_exactly():
    """The static-cache step compiled by Dynamo's ``cudagraphs`` backend runs the traced ATen ops as eager does, so
    only omni's own compiled path (the mask spec traced with tensor offsets, the padding mask kept, the CUDA-graph
    replays) could make it differ from eager: batch 8 with left-padded rows, every step's logits bit for bit."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="omni").cuda().eval()
    model = model.to(torch.bfloat16)
    gen = torch.Generator().manual_seed(6)
    prompts = torch.randint(3, 100, (8, 150), generator=gen)
    attention_mask = torch.ones_like(prompts)
    for row, pad in enumerate([0, 0, 3, 70, 0, 129, 1, 64]):  # left padding crossing 64- and 128-key blocks
        prompts[row, :pad], attention_mask[row, :pad] = 0, 0
    settings = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0,
                    cache_implementation="static", attention_mask=attention_mask.cuda(), return_dict_in_generate=True,
                    output_logits=True)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        eager = model.generate(prompts.cuda(), disable_compile=True, **settings)
        runs = [model.generate(prompts.cuda(), compile_config=CompileConfig(backend="cudagraphs", mode="default"),
                               **settings) for _ in range(2)]  # records, then replays
    torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] > 0  # the steps were compiled, not run eagerly
    for run in runs:
        assert torch.equal(run.sequences, eager.sequences)
        for step, (got, want) in enumerate(zip(run.logits, eager.logits)):
            assert torch.equal(got, want), f"step {step}: logits differ by {(got - want).abs().max()}"
