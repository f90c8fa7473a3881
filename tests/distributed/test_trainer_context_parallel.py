"""omni's context parallelism through ``transformers.Trainer`` and TRL's ``SFTTrainer`` (`ContextParallelMixin`), on
the CPU: the ranks of a row are fed the same samples and each keeps its shard; a tiny Llama trained for a few steps
with cp = 2 (gloo, torchrun, examples/trainer_context_parallel.py) by either trainer gives one process's losses and
weights, with gradient accumulation too; bad set-ups are refused, naming the argument."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Trainer, TrainingArguments

from examples.trainer_context_parallel import LENGTH, samples, tiny_llama
from omni_hf import OmniCollator
from omni_hf.distributed import ContextParallelCollator, ContextParallelMixin
from tests.helpers.brute_force import relative_error

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trainer_context_parallel.py"


class CPTrainer(ContextParallelMixin, Trainer):
    pass


def pack() -> OmniCollator:
    return OmniCollator(pad_token_id=0, mode="pack", max_length=LENGTH, pad_to_multiple_of=64)


def training_args(**kwargs) -> TrainingArguments:
    return TrainingArguments(**{**dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=2,
                                       report_to=[], save_strategy="no", use_cpu=True, remove_unused_columns=False,
                                       dataloader_num_workers=0), **kwargs})


# ---------------------------------------------------------------------- one process: refusals


def test_a_cp_size_that_does_not_divide_the_world_is_refused():
    with pytest.raises(ValueError, match="cp_size: expected a divisor of the world size 1 .* got 2"):
        CPTrainer(model=tiny_llama(), args=training_args(), train_dataset=samples(8, 100), data_collator=pack(),
                  cp_size=2)


@pytest.mark.parametrize("kwargs, extra, message", [
    (dict(average_tokens_across_devices=False), {}, "average_tokens_across_devices: expected True"),
    (dict(label_smoothing_factor=0.1), {}, "label_smoothing_factor: expected 0 .* got 0.1"),
    ({}, dict(compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss),
     "compute_loss_func: expected None"),
])
def test_a_loss_that_would_not_be_the_rows_is_refused(kwargs, extra, message):
    with pytest.raises(ValueError, match=message):
        CPTrainer(model=tiny_llama(), args=training_args(**kwargs), train_dataset=samples(8, 100),
                  data_collator=pack(), cp_size=1, **extra)


def test_a_schedule_of_another_name_is_refused():
    with pytest.raises(ValueError, match=r"schedule: expected 'auto' or one of \('all_gather', 'direct', 'ring', "
                                         r"'hybrid'\), got 'gather'"):
        CPTrainer(model=tiny_llama(), args=training_args(), train_dataset=samples(8, 100), data_collator=pack(),
                  cp_size=1, schedule="gather")


def test_a_model_without_omni_attention_is_refused():
    model = tiny_llama()
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="model: expected attn_implementation='omni' .* got 'eager'"):
        CPTrainer(model=model, args=training_args(), train_dataset=samples(8, 100), data_collator=pack(), cp_size=1)


def test_a_collator_without_the_token_rule_ids_is_refused():
    from transformers import default_data_collator

    collate = ContextParallelCollator(default_data_collator, world_size=2, rank=0)
    with pytest.raises(ValueError, match="collator: expected a packer whose batches hold omni_doc_ids, omni_group_ids "
                                         "and labels .omni_hf.OmniCollator., got function, whose batch lacks "
                                         "omni_doc_ids, omni_group_ids, labels"):
        collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6]}])


# ---------------------------------------------------------------------- ranks: the loader


def _rank_main(rank, world_size, port, target, folder, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.save(target(rank, world_size, *args), os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(world_size: int, target, tmp_path, *args) -> list:
    """``world_size`` gloo ranks with torchrun's environment (accelerate reads it) running
    ``target(rank, world_size, *args)``; their results."""
    port = 29500 + (os.getpid() + 500) % 1000
    mp.start_processes(_rank_main, args=(world_size, port, target, str(tmp_path), args), nprocs=world_size,
                       start_method="spawn")
    return [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def loader_rank(rank, world_size, cp_size):
    trainer = CPTrainer(model=tiny_llama(), args=training_args(train_sampling_strategy="sequential"),
                        train_dataset=samples(16, 100), data_collator=pack(), cp_size=cp_size)
    batches = []
    for batch in trainer.get_train_dataloader():
        cp = batch.pop("omni_context_parallel")
        batches.append({"bounds": cp.bounds, "rank": cp.rank, "doc_ids": cp.doc_ids,
                        **{key: value for key, value in batch.items()}})
    return {"cp_rank": trainer.cp_rank, "dp_rank": trainer.dp_rank, "batches": batches,
            "token_cost": trainer.token_cost}


def test_the_ranks_of_a_row_get_the_same_samples_and_keep_their_shard(tmp_path):
    """cp = 2, dp = 1, samples in order: batch i of each rank is `ContextParallelCollator`'s shard of samples
    4i..4i+3 (the whole dataset once, not half of it per rank)."""
    data = samples(16, 100)
    ranks = run_ranks(2, loader_rank, tmp_path, 2)
    for rank, got in enumerate(ranks):
        assert (got["cp_rank"], got["dp_rank"]) == (rank, 0)
        assert len(got["batches"]) == 4
        collate = ContextParallelCollator(pack(), world_size=2, rank=rank, token_cost=got["token_cost"])
        for index, batch in enumerate(got["batches"]):
            want = collate(data[4 * index:4 * index + 4])
            cp = want.pop("omni_context_parallel")
            assert batch["bounds"] == cp.bounds and batch["rank"] == rank
            assert torch.equal(batch["doc_ids"], cp.doc_ids)
            assert set(batch) - {"bounds", "rank", "doc_ids"} == set(want)
            for key, value in want.items():
                assert torch.equal(batch[key], value), key


# ---------------------------------------------------------------------- training: against one process


def train(tmp_path: Path, ranks: int, *args: str) -> tuple[list[float], dict]:
    """examples/trainer_context_parallel.py on ``ranks`` processes (torchrun when more than one): the micro-batch
    losses and the trained weights."""
    out, weights = tmp_path / f"losses{ranks}.json", tmp_path / f"weights{ranks}.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc-per-node={ranks}"]
    subprocess.run([*launch, str(EXAMPLE), "--json", str(out), "--weights", str(weights), *args], check=True, env=env,
                   timeout=600)
    return json.loads(out.read_text())["losses"], torch.load(weights)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["trainer", "sft"])
@pytest.mark.parametrize("args", [
    ("--steps", "3"),                                                        # AdamW
    ("--steps", "2", "--accumulation", "2", "--optim", "sgd", "--lr", "1"),  # the update is the gradient
], ids=["adamw", "accumulation"])
def test_trainer_with_context_parallelism_trains_as_one_process(trainer, args, tmp_path):
    """cp = 2 (dp = 1) against the same trainer class in one process (Trainer, or TRL's SFTTrainer with its fused LM
    head, in float32: SFTConfig's default bf16 autocast would move the gradients by ~1e-3) on the same samples and
    seed: every micro-batch's loss and the final weights within 1e-5 (the exact reference attention)."""
    if trainer == "sft":
        pytest.importorskip("trl", reason="TRL is not installed")
        pytest.importorskip("datasets", reason="datasets is not installed (SFTTrainer takes a datasets.Dataset)")
    args = ("--trainer", trainer, *args)
    one_losses, one_weights = train(tmp_path, 1, "--cp", "1", *args)
    cp_losses, cp_weights = train(tmp_path, 2, *args)
    assert len(cp_losses) == len(one_losses) > 0
    for got, want in zip(cp_losses, one_losses):
        assert abs(got - want) <= 1e-5 * abs(want), (cp_losses, one_losses)
    for name, want in one_weights.items():
        assert relative_error(cp_weights[name], want) <= 1e-5, name


@pytest.mark.slow
def test_two_rows_of_two_ranks_train_as_one_process_on_both_rows(tmp_path):
    """dp = 2 x cp = 2 (4 ranks; each data rank packs 4 samples) against one process packing the same 8 samples per
    step: Trainer weights the rows by their labelled tokens, as one process does over the 8 samples' rows."""
    one_losses, one_weights = train(tmp_path, 1, "--cp", "1", "--batch", "8")
    cp_losses, cp_weights = train(tmp_path, 4, "--cp", "2", "--batch", "4")
    for got, want in zip(cp_losses, one_losses, strict=True):
        assert abs(got - want) <= 1e-5 * abs(want), (cp_losses, one_losses)
    for name, want in one_weights.items():
        assert relative_error(cp_weights[name], want) <= 1e-5, name
