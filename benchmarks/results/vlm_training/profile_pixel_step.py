"""Profile one pixel step of the VLM benchmark: top CUDA kernels per backend."""
import sys, time, torch, os
os.environ.setdefault("OMNI_HF_BACKEND", "cuda")
import benchmarks.bench_vlm_training as bench
arch, length = sys.argv[1], int(sys.argv[2])
rows = sys.argv[3:]
dev, dtype = torch.device("cuda"), torch.bfloat16
for spec in rows:
    attn, vision = spec.split(":")
    model = bench.build_model(arch, attn, False, 0, dev, dtype, vision)
    batch, counts = bench.packed_row(model.config, length, 0, bench.REAL, dtype)
    make = bench.step_inputs(model, batch, attn, dev, True)
    opt = bench.optimizer_for(model)
    for _ in range(2):
        bench.train_step(model, opt, make(), 4096)
    torch.cuda.synchronize()
    # tower alone
    pix = {k: batch[k].to(dev) for k in ("pixel_values", "image_grid_thw") if k in batch}
    with torch.no_grad():
        for _ in range(2): model.model.get_image_features(**pix)
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(3): model.model.get_image_features(**pix)
        torch.cuda.synchronize(); tower = (time.perf_counter() - t) / 3
    t = time.perf_counter(); bench.train_step(model, opt, make(), 4096); torch.cuda.synchronize(); step = time.perf_counter() - t
    print(f"== {arch} {attn} tower={vision}: step {step*1e3:.0f} ms, tower alone {tower*1e3:.0f} ms, pixel_values {tuple(batch['pixel_values'].shape)}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
        bench.train_step(model, opt, make(), 4096)
        torch.cuda.synchronize()
    ev = prof.key_averages()
    print(ev.table(sort_by="self_cuda_time_total", row_limit=22, max_name_column_width=100))
    del model, opt, make, batch; bench.free_memory()
