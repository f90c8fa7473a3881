"""One packed row split across processes: a stock Transformers model trained with omni's context parallelism.

    torchrun --nproc-per-node 2 examples/context_parallel.py                 # CPU (gloo), a tiny Llama, seconds
    torchrun --nproc-per-node 2 examples/context_parallel.py --device cuda --length 65536 --hidden 2048 --layers 16

Every rank builds the same packed batch (here synthetic interleaved samples: text with image spans that attend
both ways), `ContextParallel.for_batch` cuts its rows into shards of equal attention work at positions that split
no image, each rank runs the model on its shard (`shard_batch`: tokens, positions, labels shifted across the cuts,
the row's label count), and every attention layer attends its queries over the whole row. The rank losses sum to
the row's loss; the gradients are summed over the ranks before the optimizer step.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig

import omni_hf  # noqa: F401  (registers attn_implementation="omni")
from omni_hf import OmniCollator
from omni_hf.distributed import ContextParallel


def synthetic_samples(length: int, vocab: int, seed: int) -> list[dict]:
    """Interleaved samples of 200-2000 tokens with a 64-576-token image span each, about ``length`` tokens in all."""
    gen = torch.Generator().manual_seed(seed)
    samples, total = [], 0
    while total < length:
        size = min(int(torch.randint(200, 2001, (1,), generator=gen)), length - total)
        if size < 80:
            break
        image = min(int(torch.randint(64, 577, (1,), generator=gen)), size - 16)
        start = int(torch.randint(1, size - image, (1,), generator=gen))
        samples.append({"input_ids": torch.randint(1, vocab, (size,), generator=gen).tolist(),
                        "modality_spans": [(start, start + image)]})
        total += size
    return samples


def row_loss_and_gradient(model, batch: dict, sharded: bool) -> tuple[float, torch.Tensor]:
    """The loss of the whole row and its flattened gradient: by context parallelism over the ranks, or by this
    process alone."""
    model.zero_grad()
    inputs = ContextParallel.for_batch(batch["omni_doc_ids"], batch["omni_group_ids"]).shard_batch(batch) if sharded \
        else {key: batch[key] for key in ("input_ids", "labels", "position_ids", "omni_doc_ids", "omni_group_ids")}
    loss = model(**inputs).loss
    loss.backward()
    gradient = torch.cat([p.grad.flatten().float() for p in model.parameters()])
    loss = loss.detach()
    if sharded:
        dist.all_reduce(loss)
        dist.all_reduce(gradient)
    model.zero_grad()
    return loss.item(), gradient


def check_against_one_process(model, batch: dict) -> None:
    """Prints the whole row's loss and gradient by both routes, and how far apart they are."""
    one_loss, one_grad = row_loss_and_gradient(model, batch, sharded=False)
    cp_loss, cp_grad = row_loss_and_gradient(model, batch, sharded=True)
    if dist.get_rank() == 0:
        print(f"check: loss one process {one_loss:.6f}, context parallel {cp_loss:.6f}; gradient relative "
              f"difference {((cp_grad - one_grad).norm() / one_grad.norm()).item():.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, one GPU per rank)")
    parser.add_argument("--length", type=int, default=4096, help="tokens per packed row")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="first compare step 0's loss and gradients with one "
                        "process running the whole row")
    args = parser.parse_args()
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank()
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0))) if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same weights on every rank
    heads = max(1, args.hidden // 64)
    config = LlamaConfig(vocab_size=1000, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads,
                         head_dim=args.hidden // heads, max_position_embeddings=args.length)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(config, attn_implementation="omni").to(device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    collate = OmniCollator(pad_token_id=0, mode="pack", max_length=args.length, pad_to_multiple_of=args.length)
    for step in range(args.steps):
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        batch = {key: value.to(device) for key, value in collate(synthetic_samples(args.length, 1000, step)).items()}
        if args.check and step == 0:
            check_against_one_process(model, batch)
        cp = ContextParallel.for_batch(batch["omni_doc_ids"], batch["omni_group_ids"])
        loss = model(**cp.shard_batch(batch)).loss
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)  # the shards' gradients sum to the row's
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(loss := loss.detach())
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f} (rank 0 holds tokens {cp.start}:{cp.stop} of {args.length}), "
                  f"{args.length / (time.perf_counter() - start):.0f} tokens/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
