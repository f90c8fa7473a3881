#!/usr/bin/env bash
# Installs what flex_attention(..., kernel_options={"BACKEND": "FLASH"}) imports (flash-attn-4's CuTe-DSL
# kernels, nvidia-cutlass-dsl, quack-kernels, apache-tvm-ffi, ...) from carried wheels, on a machine without a
# package index, then says whether `flash_attn.cute` imports (and prints the exact error if not).
#
#   bash benchmarks/flash_setup.sh [WHEELS] [SITE]    # defaults: .whl_flash and /tmp/site
#   . SITE/env.sh                                     # PYTHONPATH for the run (the script writes it)
#
# WHEELS: *.whl and split pieces NAME.whl.part0, .part1, ... in any subfolders. The cutlass wheel (74 MB) is split
# in two: carry .whl_flash/a in one call and .whl_flash/b in the next. Every piece seen is first copied to STASH
# (/tmp/whl_flash), which a warm machine keeps between calls, so the second call finds both. Pieces are joined
# with cat; every wheel must match benchmarks/flash_wheels.sha256.
# Wheels are unzipped into SITE, not installed with `pip --target`: nvidia-cutlass-dsl's wheels share the
# nvidia_cutlass_dsl/ folder, which `pip --target --upgrade` replaces wholesale. PYTHONPATH does not read .pth
# files, so env.sh also names the folder nvidia_cutlass_dsl.pth would add (without it: "No module named 'cutlass'").
# cuda-bindings (.whl_flash/c) goes in only when the machine's Python has none: torch 2.11+cu130 depends on it.
# FA4=fa4 takes fa4 4.0.0b3 instead of flash-attn-4 4.0.0b5 (the same flash_attn.cute package, two weeks apart).
# FLASH_SMOKE=1 also runs a small compiled FLASH forward+backward on the GPU against float32 math.
# Exit status: 0 when flash_attn.cute imports, 1 when it does not, 2 when wheels are missing or corrupt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-.whl_flash}
site=${2:-/tmp/site}
stash=${FLASH_STASH:-/tmp/whl_flash}
sums=${FLASH_SHA256:-$here/flash_wheels.sha256}
py=${PYTHON:-python3}
fa4=${FA4:-flash_attn_4}

mkdir -p "$stash"
[ -d "$src" ] && find "$src" -type f \( -name '*.whl' -o -name '*.whl.part*' \) -exec cp -f {} "$stash"/ \;
for first in "$stash"/*.whl.part0; do                  # join NAME.whl.part0 part1 ... into NAME.whl
    [ -e "$first" ] || continue
    whl=${first%.part0}
    cat $(ls "$whl".part* | sort -V) > "$whl"
done

missing=()
while read -r sum name; do                             # check every wheel that is there against its sum
    [ -e "$stash/$name" ] || { missing+=("$name"); continue; }
    if [ "$(sha256sum "$stash/$name" | cut -d' ' -f1)" != "$sum" ]; then
        pieces=$(cd "$stash" && ls "$name".part* 2>/dev/null | sed 's/.*\.whl\.//' | tr '\n' ' ')
        echo "flash_setup: $name: sha256 mismatch (pieces here: ${pieces:-none}; one missing or corrupt)"
        rm -f "$stash/$name"; missing+=("$name")
    fi
done < <(grep -v '^#' "$sums")

need=(nvidia_cutlass_dsl_libs_base- nvidia_cutlass_dsl-4 "$fa4"- quack_kernels- apache_tvm_ffi- einops-
      torch_c_dlpack_ext-)
bindings=machine
"$py" -c "import cuda.bindings.driver" 2>/dev/null || { bindings=carried; need+=(cuda_bindings- cuda_pathfinder-); }
wheels=()
for prefix in "${need[@]}"; do                        # the checked wheel of each package, from the sums file
    name=$(grep -v '^#' "$sums" | awk '{print $2}' | grep "^$prefix" | head -1)
    if [ -z "$name" ] || [ ! -e "$stash/$name" ]; then
        extra=$([ $bindings = carried ] && echo ', and .whl_flash/c (this Python has no cuda.bindings)')
        echo "flash_setup: ${name:-$prefix*.whl} is not here yet (${#missing[@]} wheels missing);" \
             "carry .whl_flash/a, then .whl_flash/b$extra"
        exit 2
    fi
    wheels+=("$stash/$name")
done

rm -rf "$site" && mkdir -p "$site"
for whl in "${wheels[@]}"; do "$py" -m zipfile -e "$whl" "$site" || exit 2; done
touch "$site/flash_attn/__init__.py"                   # so that an installed flash-attn 2 cannot shadow it
cat > "$site/env.sh" <<EOF
export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/python_packages\${PYTHONPATH:+:\$PYTHONPATH}"
EOF
. "$site/env.sh"
echo "flash_setup: unzipped $(basename -a "${wheels[@]}" | tr '\n' ' ')into $site (cuda.bindings: $bindings)"

"$py" - <<'EOF'
import importlib.metadata as md, os, sys, traceback
names = ("flash-attn-4", "fa4", "nvidia-cutlass-dsl-libs-base", "quack-kernels", "apache-tvm-ffi", "cuda-bindings",
         "torch")
print("flash_setup: python", sys.version.split()[0], "|", ", ".join(
    f"{n} {v}" for n in names if (v := next((d.version for d in md.distributions() if d.metadata["Name"] == n), None))))
try:
    import cutlass.cute
    import flash_attn.cute
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd  # what Inductor's FLASH templates call
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    import torch
    from torch._inductor.kernel.flex.flex_flash_attention import ensure_flash_available
    assert ensure_flash_available(), "torch's ensure_flash_available() says no"
except BaseException:
    traceback.print_exc()
    print("flash_setup: flash_attn.cute does NOT import (error above)")
    sys.exit(1)
print(f"flash_setup: flash_attn.cute imports ({flash_attn.cute.__file__}); cutlass from {cutlass.__file__}")
if os.environ.get("FLASH_SMOKE") == "1" and torch.cuda.is_available():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    q, k, v = (torch.randn(1, 4 if i == 0 else 2, 512, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for i in range(3))
    causal = create_block_mask(lambda b, h, i, j: i >= j, None, None, 512, 512, device="cuda")
    try:
        out = torch.compile(flex_attention)(q, k, v, block_mask=causal, enable_gqa=True,
                                            kernel_options={"BACKEND": "FLASH"})
        out.sum().backward()
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                                               enable_gqa=True)
        print(f"flash_setup: FLASH smoke test (causal, S=512, D=128, GQA 4/2): max |out - fp32| "
              f"{(out.float() - ref).abs().max().item():.3g}, dq finite {bool(q.grad.isfinite().all())}")
    except BaseException:
        traceback.print_exc()
        print("flash_setup: the FLASH smoke test failed (error above); flash_attn.cute itself imports")
EOF
