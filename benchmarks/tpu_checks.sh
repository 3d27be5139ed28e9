#!/usr/bin/env bash
# On a TPU host: the checks that need the chip, in one go, each bounded and logged.
#   bash benchmarks/tpu_checks.sh OUTDIR [JAXBENCH_BENCHMARK_DIR]
# Run from the project's root with tilewright importable (a TPU VM: the project's wheel
# and its dependencies installed; jax and libtpu from the image). One program at a time
# holds the chip, so the steps run one after another:
#   1. `tilewright eval --task gelu --json` on the chip (the exported route, device time)
#   2. tests/test_on_tpu.py (eval, estimate and profile in a pool; the busy-chip error)
#   3. benchmarks/measure_on_chip.py: the bundled softmax and rmsnorm tunings, and the
#      JAXBench baselines named below when a JAXBench checkout is given
# Each step's output goes to OUTDIR/<step>.log; the measured rows to OUTDIR/measured.jsonl.
set -u
out=${1:?usage: tpu_checks.sh OUTDIR [JAXBENCH_BENCHMARK_DIR]}
jb=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
step() {
  local t=$1 name=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$t" "$@" > "$out/$name.log" 2>&1
  echo "=== $name rc=$? ($(date +%T))"
  tail -c 700 "$out/$name.log"
}
step 300 eval_gelu python -m tilewright.tui.cli eval --task gelu --json
step 300 tests env TILEWRIGHT_TPU_TESTS=1 python -m pytest -q -p no:cacheprovider tests/test_on_tpu.py
programs=(bundled:softmax bundled:rmsnorm)
if [ -n "$jb" ]; then
  for name in 9p_SwiGLU_MLP 12p_RMSNorm 41k_Gemm_Add_ReLU 13p_Cross_Entropy 8p_GEMM \
      1p_Flash_Attention 5p_Flex_Attention; do
    programs+=("$jb/$name")
  done
fi
step 400 measure python benchmarks/measure_on_chip.py "${programs[@]}" --points 6 \
  --budget 1 --out "$out/measured.jsonl"
