"""Packed rows split across GPUs: a stock Transformers model trained with omni's context parallelism under DDP or FSDP2.

    torchrun --nproc-per-node 2 examples/context_parallel.py                          # CPU (gloo), tiny Llama
    torchrun --nproc-per-node 2 examples/context_parallel.py --device cuda --model tinyllama-1.1b --length 65536
    torchrun --nproc-per-node 4 examples/context_parallel.py --cp 2 --engine ddp      # 2 rows at a time, 2 ranks each
    accelerate launch --num-processes 2 examples/context_parallel.py --device cuda --engine accelerate

The ranks form a data x context mesh (``--cp`` ranks share a row; the data-parallel ranks take different rows).
A DataLoader builds the batches ahead: synthetic packed rows (text samples with image spans that attend both ways)
collated by `OmniCollator`, cut by `ContextParallelCollator` into shards of equal work (attention pairs plus each
token's projections, MLP and LM head) at positions that split no image. The engine (``--engine fsdp2``: parameters,
gradients and optimizer state sharded over every rank; ``ddp``: replicated; ``accelerate``: FSDP2 through
accelerate's plugin, for ``accelerate launch``) averages the gradients, bucketed and overlapped with the backward;
the ranks' losses average to the row's, so that average is the row's gradient.

``--schedule`` picks how attention brings other shards' keys (`ContextParallel.schedule`: ``auto``, ``direct``,
``ring``, ``hybrid``, ``all_gather``); ``--emulate-nodes 2`` splits the row's ranks into two nodes of one host whose
links run at ``--link-gb-s`` (default 45 GB/s, InfiniBand NDR: about 1/8 of NVLink 4; `Topology.emulated` holds each
cross-node transfer back to that rate), so a two-node schedule can be measured on one host. Several values of either
are timed in turn in one launch, each after ``--warmup`` steps; a run over emulated nodes carries ``vs_nvlink``, its
tokens/s over the same schedule's on the real links.

    torchrun --nproc-per-node 4 examples/context_parallel.py --device cuda --model tinyllama-1.1b --length 65536 \
        --emulate-nodes 1 2 --schedule hybrid ring direct all_gather

``--check`` first compares the engine's loss and gradients with one process running each whole row (with the first
schedule). Printed last: tokens/s, peak memory per rank and each rank's attention time (its imbalance), and each
run's tokens/s; ``--json`` writes them, with each run's cuts, pairs computed and keys received per rank, and the
first timed row's ids as runs (``row``), which benchmarks/context_parallel_model.py's ``fit`` reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import itertools
import json
import os
import statistics
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm
from transformers import AutoModelForCausalLM, LlamaConfig

import omni_hf  # noqa: F401  (registers attn_implementation="omni")
from omni_hf import OmniCollator, omni_attention
from omni_hf.distributed import SCHEDULES, ContextParallel, ContextParallelCollator, Topology, token_work_in_pairs
from omni_hf.distributed.plan import NVLINK_TO_INFINIBAND

MODELS = {  # random weights of these sizes
    "tiny": dict(vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
    "tinyllama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, head_dim=64),
}


class SyntheticRows(Dataset):
    """Row ``i``: a list of samples (``sample_tokens`` tokens, default 200-2000, one 64-576-token image span each)
    filling ``length`` tokens."""

    def __init__(self, length: int, vocab: int, rows: int, seed: int = 0, sample_tokens: tuple[int, int] = (200, 2000)):
        self.length, self.vocab, self.rows, self.seed = length, vocab, rows, seed
        self.sample_tokens = sample_tokens

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> list[dict]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        samples, total = [], 0
        while self.length - total >= 80:
            size = min(int(torch.randint(self.sample_tokens[0], self.sample_tokens[1] + 1, (), generator=gen)),
                       self.length - total)
            image = min(int(torch.randint(64, 577, (), generator=gen)), size - 16)
            start = int(torch.randint(1, size - image, (), generator=gen))
            samples.append({"input_ids": torch.randint(1, self.vocab, (size,), generator=gen).tolist(),
                            "modality_spans": [(start, start + image)]})
            total += size
        return samples


def build_model(name: str, length: int, device: torch.device, checkpointing: bool) -> torch.nn.Module:
    """The named model (the same random weights on every rank), in bf16 on a GPU, float32 on the CPU."""
    torch.manual_seed(0)
    config = LlamaConfig(**MODELS[name], max_position_embeddings=max(length, 2048), use_cache=False)  # training only
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):  # random weights drawn where they live: no 1B-parameter initialisation on the CPU
        model = AutoModelForCausalLM.from_config(config, attn_implementation="omni", dtype=dtype)
    if checkpointing:
        enable_checkpointing(model, {"use_reentrant": False})
    return model


def enable_checkpointing(model: torch.nn.Module, kwargs: dict) -> None:
    """Activation checkpointing under the name the installed Transformers gives it (``activation_checkpointing_enable``;
    releases without it know only ``gradient_checkpointing_enable``, which later ones deprecate)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def wrap(model: torch.nn.Module, engine: str, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model under ``engine`` over every rank (data and context ranks hold the same parameters), and its AdamW.

    ``accelerate`` is FSDP2 set up by accelerate's plugin (one unit per decoder layer); only the model and the
    optimizer go through ``Accelerator.prepare``: a prepared DataLoader would give every rank other rows, where the
    ranks of one row need the same."""
    if engine == "accelerate":
        if device.type != "cuda":
            raise SystemExit("--engine accelerate: accelerate runs FSDP on CUDA only (on the CPU it would run no "
                             "engine); use --engine fsdp2 or ddp")
        from accelerate import Accelerator
        from accelerate.utils import FullyShardedDataParallelPlugin

        layer = type(model.model.layers[0]).__name__
        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=[layer]))
        return accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    if engine == "ddp":
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        everyone = init_device_mesh(device.type, (dist.get_world_size(),))
        for layer in model.model.layers:
            fully_shard(layer, mesh=everyone)
        fully_shard(model, mesh=everyone)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


ROW_INPUTS = ("input_ids", "labels", "position_ids", "omni_doc_ids", "omni_group_ids")


class WholeRows:
    """``collate_fn`` where a row has one rank (no context parallelism): the model inputs of the packed rows."""

    def __init__(self, pack: OmniCollator):
        self.pack = pack

    def __call__(self, samples: list[dict]) -> dict:
        batch = self.pack(samples)
        return {key: batch[key] for key in ROW_INPUTS}


def to_device(batch: dict, device: torch.device, group, layout: tuple[str, Topology | None]
              ) -> tuple[dict, ContextParallel]:
    """The model inputs of a loader batch on ``device``, and its shard bound to the row's process group with the
    run's ``(schedule, topology)`` (for a whole row, a one-rank `ContextParallel` that only the attention timing
    reads)."""
    batch = dict(batch)
    cp = batch.pop("omni_context_parallel", None)
    inputs = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    if cp is None:
        return inputs, ContextParallel(inputs["omni_doc_ids"], inputs["omni_group_ids"],
                                       (0, inputs["input_ids"].shape[1]), 0)
    schedule, topology = layout
    cp = dataclasses.replace(cp.to(device, group=group, non_blocking=True), schedule=schedule, topology=topology)
    inputs["omni_context_parallel"] = cp
    return inputs, cp


def full_gradient(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's gradient, flattened, float32 (FSDP2's shards gathered)."""
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return torch.cat([g.flatten().float() for g in grads])


def check(engine_model, reference, inputs: dict, whole_rows: tuple[dict, dict]) -> dict:
    """Loss and gradient of the engine on the shards against ``reference`` (the same weights, unwrapped) on each
    whole row, both averaged over every rank as the engine averages; relative differences. The yardstick of the
    gradients' difference, ``grad_noise``: one process's gradient on the row against its gradient on the same
    samples packed in reverse order (the same sums in another order: what the dtype's rounding alone moves)."""
    check_same_row(inputs["omni_context_parallel"])
    loss = engine_model(**inputs).loss
    loss.backward()
    cp_loss = loss.detach().clone()
    dist.all_reduce(cp_loss)
    cp_grad = full_gradient(engine_model)
    engine_model.zero_grad(set_to_none=True)
    (one_loss, one_grad), (_, reordered_grad) = (averaged_loss_and_gradient(reference, row) for row in whole_rows)
    world = dist.get_world_size()
    return {"loss_one_process": one_loss, "loss_context_parallel": cp_loss.item() / world,
            "loss_rel_diff": abs(cp_loss.item() / world - one_loss) / abs(one_loss),
            "grad_rel_diff": relative_difference(cp_grad, one_grad),
            "grad_noise": relative_difference(reordered_grad, one_grad)}


def check_same_row(cp: ContextParallel) -> None:
    """Raises where the ranks of a row were given different rows (a sampler over every rank instead of the data
    ranks, or samples drawn at random per worker): their shards would then attend to other rows' keys."""
    digest = zlib.crc32(cp.doc_ids.cpu().numpy().tobytes() + cp.group_ids.cpu().numpy().tobytes())
    digests = [None] * cp.world_size
    dist.all_gather_object(digests, digest, group=cp.group)
    if len(set(digests)) > 1:
        raise SystemExit(f"the ranks of one row hold different rows (id checksums {digests}): their DataLoaders must "
                         "sample over the data-parallel ranks only")


def averaged_loss_and_gradient(model, inputs: dict) -> tuple[float, torch.Tensor]:
    """``model``'s loss and flattened float32 gradient on ``inputs``, averaged over every rank."""
    loss = model(**inputs).loss
    loss.backward()
    grad = torch.cat([p.grad.flatten().float() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    loss = loss.detach().clone()
    for total in (loss, grad):
        dist.all_reduce(total)
        total /= dist.get_world_size()
    return loss.item(), grad


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def attention_ms(cp: ContextParallel, config: LlamaConfig, dtype: torch.dtype, device: torch.device) -> float:
    """Milliseconds of one layer's attention forward + backward for this rank's shard (kernel time only, no
    communication): random q of the shard against the keys up to its end, median of a few runs."""
    gen = torch.Generator(device).manual_seed(cp.rank)
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    shape = dict(device=device, dtype=dtype, generator=gen)
    q = torch.randn(1, heads, cp.stop - cp.start, dim, **shape).requires_grad_()
    k, v = (torch.randn(1, kv_heads, cp.stop, dim, **shape).requires_grad_() for _ in range(2))
    mask = cp.mask(q.shape[2], None, device)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        omni_attention(q, k, v, mask).sum().backward()
        if device.type == "cuda":
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


CPU_IMBALANCE = (
    "On the CPU the attention times are the exact reference's, which scores every (query, key) pair up to the end "
    "of a rank's shard, allowed or masked, while the ranks share the machine's cores: the imbalance measures that, "
    "not the balance on GPUs, whose kernels skip masked blocks (the shards are cut for the kernels' work).")


def gathered(value: float) -> list[float]:
    """``value`` of every rank, by rank."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu (gloo) or cuda (nccl, one GPU "
                        "per rank)")
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument("--engine", default="fsdp2", choices=("fsdp2", "ddp", "accelerate"),
                        help="FSDP2 (fully_shard), DDP, or FSDP2 through accelerate (CUDA only)")
    parser.add_argument("--cp", type=int, default=None, help="ranks sharing a row (default: all)")
    parser.add_argument("--length", type=int, default=4096, help="tokens per packed row")
    parser.add_argument("--steps", type=int, default=6, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="steps before the timed ones")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers building the batches")
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    parser.add_argument("--check", action="store_true", help="first compare loss and gradients with one process")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here (rank 0)")
    parser.add_argument("--schedule", nargs="+", default=["auto"], choices=("auto", *SCHEDULES),
                        help="how attention brings other shards' keys; several: each timed in turn (default auto: "
                             "direct in one node, hybrid across nodes)")
    parser.add_argument("--emulate-nodes", type=int, nargs="+", default=[1],
                        help="split the row's ranks into this many nodes whose links run at --link-gb-s (several: "
                             "each timed in turn; 1: the real links)")
    parser.add_argument("--link-gb-s", type=float, default=NVLINK_TO_INFINIBAND,
                        help="the emulated link between nodes, GB/s per GPU and direction (default: InfiniBand NDR, "
                             "about 1/8 of NVLink 4)")
    parser.add_argument("--sample-tokens", type=int, nargs=2, default=[200, 2000], metavar=("MIN", "MAX"),
                        help="tokens per packed sample (one image each); long samples make the shards need each "
                             "other's keys")
    args = parser.parse_args()

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=datetime.timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    cp_size = world if args.cp is None else args.cp
    if cp_size < 1 or world % cp_size:
        raise SystemExit(f"--cp: expected a divisor of the {world} ranks, got {cp_size}")
    layouts = run_layouts(args, cp_size)
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world // cp_size, cp_size), mesh_dim_names=("dp", "cp"))
    cp_group, dp_rank, cp_rank = mesh["cp"].get_group(), mesh["dp"].get_local_rank(), mesh["cp"].get_local_rank()

    model = build_model(args.model, args.length, device, checkpointing=not args.no_checkpointing)
    config, dtype = model.config, model.dtype
    reference = build_model(args.model, args.length, device, checkpointing=True) if args.check else None
    model, optimizer = wrap(model, args.engine, device)

    rows = SyntheticRows(args.length, config.vocab_size, rows=(args.warmup + args.steps + 1) * (world // cp_size),
                         sample_tokens=args.sample_tokens)
    pack = OmniCollator(pad_token_id=0, mode="pack", max_length=args.length, pad_to_multiple_of=args.length)
    shard = ContextParallelCollator(pack, world_size=cp_size, rank=cp_rank, token_cost=token_work_in_pairs(config)) \
        if cp_size > 1 else WholeRows(pack)
    loader = DataLoader(rows, batch_size=None, sampler=DistributedSampler(rows, world // cp_size, dp_rank, False),
                        collate_fn=shard, num_workers=args.workers, pin_memory=device.type == "cuda")
    batches = list(itertools.islice(loader, args.warmup + args.steps))  # each run trains on the same rows

    result = {"model": args.model, "engine": args.engine, "gpus" if device.type == "cuda" else "ranks": world,
              "cp": cp_size, "seq_len": args.length, "sample_tokens": args.sample_tokens,
              "checkpointing": not args.no_checkpointing, "sizes": model_sizes(config)}
    if args.check:
        whole_rows = tuple({key: value.to(device) for key, value in WholeRows(pack)(samples).items()}
                           for samples in (rows[dp_rank], rows[dp_rank][::-1]))
        inputs = to_device(shard(rows[dp_rank]), device, cp_group, layouts[0])[0]
        result.update(check(model, reference, inputs, whole_rows))
        del reference, whole_rows
        if device.type == "cuda":  # the peak printed last is the training's
            torch.cuda.reset_peak_memory_stats(device)

    runs = [train(model, optimizer, batches, device, cp_group, layout, args, world // cp_size) for layout in layouts]
    first = runs[0]
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0  # the training's, not the timing's
    attention = sum(attention_ms(cp, config, dtype, device) for cp in first.pop("shards"))
    per_rank = {"tokens": gathered(first["bounds"][cp_rank + 1] - first["bounds"][cp_rank]),
                "attention_ms": gathered(attention)}
    if device.type == "cuda":
        per_rank["peak_memory_gib"] = gathered(peak / 2**30)
        per_rank["static_memory_gib"] = gathered(first.pop("static") / 2**30)
    for run in runs:
        run.pop("shards", None), run.pop("static", None)
        same_schedule_one_node = [r for r in runs if r["schedule"] == run["schedule"] and r["nodes"] == 1]
        if run["nodes"] > 1 and same_schedule_one_node:
            run["vs_nvlink"] = run["tokens_per_s"] / same_schedule_one_node[0]["tokens_per_s"]
    result.update({key: first[key] for key in ("tokens_per_s", "step_s", "schedule", "nodes", "link_gb_s", "bounds",
                                               "row")},
                  per_rank=per_rank, runs=runs, torch=torch.__version__,
                  imbalance=max(per_rank["attention_ms"]) / statistics.mean(per_rank["attention_ms"]) - 1)
    if device.type == "cuda":
        result.update(gpu=torch.cuda.get_device_name(device), memory_gib=torch.cuda.get_device_properties(device)
                      .total_memory / 2**30)
    if rank == 0:
        report(result, world, cp_size, device, args.json)
    # The engine's state (DDP's reducer holds a handle on the process group) goes before the group: freed after it,
    # at exit, the gloo group's destructor can wait forever on threads whose peers have left.
    del model, optimizer
    gc.collect()  # and the reference cycles among modules and their hooks with them
    dist.destroy_process_group()


def run_layouts(args: argparse.Namespace, cp_size: int) -> list[tuple[str, Topology | None]]:
    """Each (schedule, topology) to time, in order: every ``--schedule`` on every ``--emulate-nodes``."""
    if cp_size == 1:
        return [("none", None)]
    try:
        return [(schedule, Topology.emulated(cp_size, nodes, args.link_gb_s) if nodes > 1 else None)
                for nodes in args.emulate_nodes for schedule in args.schedule]
    except ValueError as err:
        raise SystemExit(f"--emulate-nodes: {err}") from None


def train(model, optimizer, batches, device: torch.device, group, layout: tuple[str, Topology | None],
          args: argparse.Namespace, rows_per_step: int) -> dict:
    """Training steps on ``batches`` (``--warmup`` of them, then ``--steps`` timed) with one (schedule, topology);
    its figures (and, for the first run's summary, its shards and the memory that a longer row does not grow)."""
    times, shards, static = [], [], 0
    progress = tqdm(batches, desc=f"steps ({layout[0]})", disable=dist.get_rank() != 0)
    for step, batch in enumerate(progress):
        inputs, cp = to_device(batch, device, group, layout)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        if device.type == "cuda":  # weights, gradients and optimizer state: what a longer row does not grow
            static = max(static, torch.cuda.memory_allocated(device))
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(loss := loss.detach())
        loss = loss.item() / dist.get_world_size()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
            shards.append(cp)
        progress.set_postfix(loss=f"{loss:.4f}",
                             tokens_per_s=f"{rows_per_step * args.length / (time.perf_counter() - start):.0f}")
    schedule, topology = layout
    cp = shards[0]
    run = {"schedule": cp.resolved_schedule() if cp.world_size > 1 else schedule,
           "nodes": 1 if topology is None else topology.nodes,
           "link_gb_s": None if topology is None else topology.link_gb_s,
           "tokens_per_s": rows_per_step * args.length / statistics.median(times), "step_s": times,
           "bounds": list(cp.bounds), "row": {"doc_runs": id_runs(cp.doc_ids), "group_runs": id_runs(cp.group_ids)},
           "shards": shards, "static": static}
    if cp.world_size > 1 and run["schedule"] != "all_gather":
        plan, _ = cp.plan()
        run["pairs_computed"] = gathered(len(plan.pairs))
        run["keys_received"] = gathered(sum(t.stop - t.start for t in plan.receives))
    return run


def id_runs(ids: torch.Tensor) -> list[list[list[int]]]:
    """Per row of ``[B, S]`` ids, its runs ``[id, length]`` (what benchmarks/context_parallel_model.py's
    ``ids_from_runs`` reads back)."""
    runs = []
    for row in ids.cpu():
        values, counts = torch.unique_consecutive(row, return_counts=True)
        runs.append([[int(v), int(c)] for v, c in zip(values, counts)])
    return runs


def model_sizes(config: LlamaConfig) -> dict:
    """The decoder's sizes, as benchmarks/context_parallel_model.py's ``ModelSizes`` takes them."""
    return {"hidden": config.hidden_size, "layers": config.num_hidden_layers, "q_heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads, "head_dim": config.head_dim,
            "intermediate": config.intermediate_size, "vocab": config.vocab_size}


def report(result: dict, world: int, cp_size: int, device: torch.device, path: Path | None) -> None:
    """Print the figures (and write them to ``path``)."""
    print(json.dumps({key: value for key, value in result.items() if key not in ("row", "runs")}, indent=1))
    per_rank = result["per_rank"]
    summary = ", ".join(f"rank {r}: {t} tokens, attention {a:.1f} ms" for r, (t, a) in
                        enumerate(zip(per_rank["tokens"], per_rank["attention_ms"])))
    print(f"{result['tokens_per_s']:.0f} tokens/s over {world} ranks ({cp_size} per row); {summary} (tokens of the "
          f"first timed row, one layer's attention summed over the timed rows); attention imbalance "
          f"{result['imbalance']:.1%}")
    for run in result["runs"]:
        link = "" if run["nodes"] == 1 else f" over {run['nodes']} emulated nodes ({run['link_gb_s']} GB/s)"
        versus = f", {run['vs_nvlink']:.3f} of the same on NVLink" if "vs_nvlink" in run else ""
        print(f"{run['schedule']}{link}: {run['tokens_per_s']:.0f} tokens/s{versus}")
    if device.type == "cpu":
        print(CPU_IMBALANCE)
    if path:
        path.write_text(json.dumps(result, indent=1) + "\n")

if __name__ == "__main__":
    main()
