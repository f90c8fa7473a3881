"""omni's context parallelism through ``transformers.Trainer`` and TRL's ``SFTTrainer``.

    class CPTrainer(ContextParallelMixin, Trainer): ...
    trainer = CPTrainer(model=model, args=TrainingArguments(..., remove_unused_columns=False),
                        train_dataset=samples, data_collator=OmniCollator(...), cp_size=2)

The ranks form a data x context mesh (``cp_size`` consecutive ranks share a packed row). What the mixin changes:

* the training DataLoader: accelerate shards it over the data-parallel ranks only, so the ranks of one row get the
  same samples, and the collator is wrapped in `ContextParallelCollator` (each rank keeps its shard of the rows,
  labels shifted across shard boundaries as ``shift_labels``);
* each batch's ``omni_context_parallel`` is moved to the device and bound to the row's process group;
* nothing in the loss: Trainer already scales it exactly (read from Trainer 5.24). ``get_batch_samples`` counts each
  rank's labelled targets from its ``shift_labels`` over the step's micro-batches and, with
  ``average_tokens_across_devices`` (the default), sums that count over every rank: the shards partition their rows,
  so the sum is the labelled tokens of every row of the step, N. The model's loss on a shard is its targets' summed
  cross-entropy over N; ``compute_loss`` multiplies it by the number of processes, and DDP / FSDP average the
  gradients over them, so the gradient is that of (summed cross-entropy of all rows of the step) / N: what one
  process gets training on the whole rows with the same batches, gradient accumulation included (Trainer leaves the
  accumulated micro-batches unscaled when it passes ``num_items_in_batch``). The collator's own
  ``num_items_in_batch`` (one row's count over the cp size, for hand-written loops, whose loss is the mean of the
  rows' means) is dropped: with data parallelism Trainer's token-weighted mean is what plain Trainer DDP computes.

Refused, naming the argument: a cp size that does not divide the world size, ``average_tokens_across_devices=False``
(each rank would divide by its shard's count), a model whose forward takes no loss kwargs, ``compute_loss_func`` and
label smoothing (both shift the shard's ``labels`` themselves, losing the target of a shard's last token), a model
whose attention is not omni's (it would see only the rank's shard), and accelerate's own context parallelism
(``ParallelismConfig(cp_size=)``, torch's SDPA ring) alongside. A collator whose batches lack ``omni_doc_ids`` is
refused by `ContextParallelCollator` at the first batch.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .context_parallel import SCHEDULES, ContextParallelCollator, token_work_in_pairs

__all__ = ["ContextParallelMixin"]


class ContextParallelMixin:
    """Mixin for ``transformers.Trainer`` and its subclasses (TRL's ``SFTTrainer``): one packed row split over
    ``cp_size`` ranks, attention exact over the row (omni's context parallelism, not accelerate's).

    Use it first among the bases: ``class CPTrainer(ContextParallelMixin, Trainer)``. Launch with torchrun (or
    ``accelerate launch``) on ``dp * cp_size`` processes; the model must use ``attn_implementation="omni"``, the
    collator must pack samples into rows with omni's ids (`omni_hf.OmniCollator`), and
    ``TrainingArguments(remove_unused_columns=False)`` keeps the samples' ``modality_spans``.

    Keyword args (the others go to the Trainer):
        cp_size: int, ranks sharing one row (default: every rank, dp = 1). Must divide the world size.
        device_mesh: optional ``DeviceMesh`` with a ``"cp"`` dimension (and ``"dp"``) to use instead of building
            ``init_device_mesh(device, (world // cp_size, cp_size), mesh_dim_names=("dp", "cp"))``; its ``cp`` size
            is then the cp size.
        token_cost: float, work per token outside attention in (q, k) pairs, for balancing the shards (default:
            `token_work_in_pairs` of the model's config, 0 where that config has no dense MLP).
        window: int, the sliding window of every layer if all have one (balances by the work it leaves).
        schedule: str, how attention brings other shards' keys (`ContextParallel.schedule`; default ``"auto"``).

    Attributes set: ``cp_size``, ``cp_rank``, ``dp_size``, ``dp_rank`` (ints), ``cp_group`` (the row's process
    group), ``device_mesh``.
    """

    def __init__(self, *args: Any, cp_size: int | None = None, device_mesh: Any = None,
                 token_cost: float | None = None, window: int | None = None, schedule: str = "auto",
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        world = self.args.world_size
        if device_mesh is not None:
            names = device_mesh.mesh_dim_names or ()
            if "cp" not in names:
                raise ValueError(f"device_mesh: expected a mesh with a 'cp' dimension (and 'dp'), got dimensions "
                                 f"{names}")
            if cp_size is not None and cp_size != device_mesh["cp"].size():
                raise ValueError(f"cp_size: expected the device_mesh's cp size {device_mesh['cp'].size()} (or None), "
                                 f"got {cp_size}")
            if set(names) - {"dp", "cp"}:
                raise ValueError(f"device_mesh: expected the dimensions ('dp', 'cp') or ('cp',), got {names}")
            cp_size = device_mesh["cp"].size()
        cp_size = world if cp_size is None else cp_size
        if not isinstance(cp_size, int) or cp_size < 1 or world % cp_size:
            raise ValueError(f"cp_size: expected a divisor of the world size {world} (ranks sharing a row), "
                             f"got {cp_size!r}")
        if schedule not in ("auto", *SCHEDULES):
            raise ValueError(f"schedule: expected 'auto' or one of {SCHEDULES}, got {schedule!r}")
        self._check_loss_is_exact()
        self.cp_size, self.dp_size = cp_size, world // cp_size
        self.window, self.schedule = window, schedule
        if token_cost is None:
            try:
                token_cost = token_work_in_pairs(self.model.config)
            except (AttributeError, ValueError):
                token_cost = 0.0
        self.token_cost = token_cost
        if cp_size == 1:  # nothing to split: plain Trainer
            self.device_mesh, self.cp_group, self.cp_rank, self.dp_rank = device_mesh, None, 0, self.args.process_index
            return
        if not dist.is_initialized():
            raise RuntimeError("ContextParallelMixin: expected an initialised torch.distributed process group, got "
                               "none (launch with torchrun or accelerate launch)")
        if device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            device_mesh = init_device_mesh(self.args.device.type, (self.dp_size, cp_size),
                                           mesh_dim_names=("dp", "cp"))
        self.device_mesh = device_mesh
        self.cp_group, self.dp_rank = _dedicated_cp_group(device_mesh)
        self.cp_rank = dist.get_rank(self.cp_group)

    def _check_loss_is_exact(self) -> None:
        """Raises where Trainer's loss on a shard would not be the shard's share of the rows' loss."""
        pc = getattr(self.accelerator, "parallelism_config", None)
        if pc is not None and getattr(pc, "cp_enabled", False):
            raise ValueError("parallelism_config: expected no accelerate context parallelism (cp_size=1: it runs "
                             "torch's SDPA ring, not omni), got cp_size="
                             f"{pc.cp_size}; pass cp_size to the ContextParallelMixin trainer instead")
        if not self.args.average_tokens_across_devices:
            raise ValueError("average_tokens_across_devices: expected True (the loss divides by the labelled tokens "
                             "of every rank's shard), got False")
        if self.compute_loss_func is not None:
            raise ValueError("compute_loss_func: expected None (it would shift each shard's labels itself and lose "
                             f"the target of a shard's last token), got {self.compute_loss_func!r}")
        if self.label_smoother is not None:
            raise ValueError("label_smoothing_factor: expected 0 (label smoothing shifts each shard's labels itself), "
                             f"got {self.args.label_smoothing_factor}")
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        implementation = getattr(text, "_attn_implementation", None)
        if implementation != "omni":
            raise ValueError("model: expected attn_implementation='omni' (other attention would see only the rank's "
                             f"shard of each row), got {implementation!r}")
        if not self.model_accepts_loss_kwargs:
            raise ValueError("model: expected a forward that takes loss kwargs (num_items_in_batch, shift_labels), "
                             f"got {type(self.model).__name__}, whose forward takes none")

    def get_train_dataloader(self):
        """The training DataLoader (accelerate's) with the collator wrapped in `ContextParallelCollator` and the
        samples sharded over the data-parallel ranks only: each batch is this rank's shard of rows packed from
        ``per_device_train_batch_size`` samples, the same samples on every rank of the row."""
        if self.cp_size == 1:
            return super().get_train_dataloader()
        collator = self.data_collator
        self.data_collator = ContextParallelCollator(collator, world_size=self.cp_size, rank=self.cp_rank,
                                                     window=self.window, token_cost=self.token_cost,
                                                     schedule=self.schedule)
        try:
            loader = super().get_train_dataloader()
        finally:
            self.data_collator = collator
        self._shard_over_data_ranks(loader)
        return loader

    def _shard_over_data_ranks(self, loader) -> None:
        """Re-point accelerate's shard of the loader (over every process) at the data-parallel ranks: a map-style
        dataset's ``BatchSamplerShard`` or an iterable one's ``IterableDatasetShard``. As Trainer does for its
        rank-aware ``BatchRebalanceSampler``."""
        shards = [part for part in (getattr(loader, "batch_sampler", None), getattr(loader, "dataset", None))
                  if part is not None and hasattr(part, "num_processes") and hasattr(part, "process_index")]
        if getattr(loader, "_dispatch_batches", False) or type(loader).__name__ == "DataLoaderDispatcher":
            raise ValueError("dispatch_batches: expected False (rank 0 would hand each rank other rows), got True")
        if not shards and self.args.world_size > 1:
            raise ValueError(f"train_dataset: expected accelerate to shard the DataLoader with a BatchSamplerShard or "
                             f"IterableDatasetShard, got a {type(loader).__name__} with neither")
        for part in shards:
            part.num_processes, part.process_index = self.dp_size, self.dp_rank

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The batch on the device with its ``omni_context_parallel`` bound to the row's process group; the
        collator's ``num_items_in_batch`` dropped (Trainer passes its own count, see the module docstring)."""
        inputs = dict(inputs)
        cp = inputs.pop("omni_context_parallel", None)
        inputs.pop("num_items_in_batch", None)
        inputs = super()._prepare_inputs(inputs)
        if cp is not None:
            inputs["omni_context_parallel"] = cp.to(self.args.device, group=self.cp_group,
                                                    non_blocking=self.args.dataloader_pin_memory)
        return inputs


def _dedicated_cp_group(device_mesh) -> tuple[Any, int]:
    """This rank's process group of the row (its ranks along the mesh's ``cp`` dimension) made anew, and the index of
    that row among the mesh's rows (the data-parallel rank).

    Not the mesh's own group: where ``cp`` spans every rank, DeviceMesh hands out the default group, on which DDP
    also launches its gradient buckets' all-reduces, asynchronously, during the backward, while the attention's
    backward sums dK / dV over the row's ranks. A group of their own keeps the attention's collectives off the
    engine's communicator, so that nothing rests on the two being issued in the same order on every rank (a
    precaution: no mismatch was seen on the shared group). Every rank makes every row's group, in the same order, as
    ``new_group`` requires."""
    names = device_mesh.mesh_dim_names
    rows = device_mesh.mesh.movedim(names.index("cp"), -1).reshape(-1, device_mesh["cp"].size()).tolist()
    me = dist.get_rank()
    mine = None
    for index, ranks in enumerate(rows):
        group = dist.new_group(ranks)
        if me in ranks:
            mine = group, index
    if mine is None:
        raise ValueError(f"device_mesh: expected this process (rank {me}) in the mesh, got ranks {rows}")
    return mine
