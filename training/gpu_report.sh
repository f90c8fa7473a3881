#!/usr/bin/env bash
# The GPU figures of README.md's "Training a small VLM", in one go (run from the repository root).
#
#   training/gpu_report.sh speed WORK_DIR               # tokens/s of omni, flex_attention and sdpa on rows of
#                                                       # 2048 and 8192 tokens, then a main run with held-out
#                                                       # accuracy and baselines
#   training/gpu_report.sh two-gpus WORK_DIR [STEPS]   # the same preset under accelerate on two GPUs
#
# Each run writes WORK_DIR/<name>/metrics.json (and metrics.png); `speed` also writes WORK_DIR/speed.json, the
# summaries of the speed runs. SPEED_SECONDS (default 240) limits each speed run, TRAIN_SECONDS (default 150) sizes
# the main run from the measured speed. EXTRA adds flags to every run (e.g. --model PATH).
set -uo pipefail
mode=${1:?speed or two-gpus}
work=${2:?work directory}
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=20  # the runs are python -m from the repository root
train() {  # train SECONDS_LIMIT NAME FLAGS...
    timeout "$1" python -m training.train_vlm --preset small --output-dir "$work/$2" "${@:3}" ${EXTRA:-}
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

case $mode in
speed)
    # Same model, same data, 60 optimizer steps each; tokens/s is the median of the 10-step intervals after
    # the first (which holds compilation and warm-up). ~26k (2048) and ~31k (8192) tokens per step.
    for rows in "2048 512" "8192 600"; do
        read -r length samples <<<"$rows"
        for attn in omni flex_attention sdpa; do
            train "${SPEED_SECONDS:-240}" "speed-$length-$attn" --attn "$attn" --max-length "$length" \
                --batch-samples "$samples" --steps 60 --warmup 10 --log-every 10 --eval-every 0 2>&1 | tail -n 8
        done
    done
    python - "$work" <<'EOF'
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])
runs = {p.parent.name: json.loads(p.read_text()) for p in sorted(work.glob("speed-*/metrics.json"))}
summary = {name: {**run["summary"], "max_length": run["config"]["max_length"], "attn": run["config"]["attn"]}
           for name, run in runs.items()}
(work / "speed.json").write_text(json.dumps(summary, indent=1))
for name, s in summary.items():
    print(f"{name:28s} {s['tokens_per_s']:>12,.0f} tokens/s  (waiting for data {s['data_wait_fraction']:.1%})")
EOF
    main=omni
    [ -f "$work/speed-2048-omni/metrics.json" ] || main=flex_attention  # still measure accuracy if omni failed
    steps=$(python - "$work/speed-2048-$main/metrics.json" "${TRAIN_SECONDS:-150}" <<'EOF'
import json, sys
train = json.load(open(sys.argv[1]))["train"][1:]
seconds_per_step = sum(r["seconds"] for r in train) / (10 * len(train))
print(max(100, int(float(sys.argv[2]) / seconds_per_step) // 100 * 100))
EOF
)
    echo "main run: attn=$main, $steps steps"
    train 600 main --attn "$main" --steps "$steps" --eval-every $((steps / 8)) --save-every 0 2>&1 | grep -v '^train:'
    ;;
two-gpus)
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision bf16 --dynamo_backend no \
        -m training.train_vlm --preset small --attn omni --output-dir "$work/two-gpus" --steps "${3:-400}" \
        --eval-every "$(( ${3:-400} / 2 ))" --log-every 10 ${EXTRA:-} 2>&1 | grep -v '^train:'
    ;;
esac
