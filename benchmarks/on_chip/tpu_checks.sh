#!/usr/bin/env bash
# On a TPU host: the checks that need the chip, in one go, each bounded and logged.
#   bash benchmarks/on_chip/tpu_checks.sh OUTDIR [JAXBENCH_BENCHMARK_DIR] [CROWNED_DIR]
# Run from the project's root with tilewright importable (a TPU VM: the project's wheel
# and its dependencies installed; jax and libtpu from the image). One program at a time
# holds the chip, so the steps run one after another (STEPS="..." picks some, in order):
#   eval     `tilewright eval --task gelu --json` on the chip (the exported route, device time)
#   tests    tests/test_on_tpu.py (eval, estimate and profile in a pool; the busy-chip error;
#            the workbench in a pseudo-terminal)
#   commands every other command on the chip, one after another, each with its wall time:
#            estimate, profile and calibrate on softmax; auto (budget 3) on softmax, then
#            replay --verify and export --test of that session, and the exported test run
#   auto     `tilewright auto` with the offline agent on the bundled causal_attention and
#            matmul_bias_gelu (AUTO_TASKS; AUTO_BUDGET versions each, default 6): what the
#            tool finds on the chip, ranked by device time
#   measure  benchmarks/on_chip/measure_on_chip.py: the bundled tasks' tunings (MEASURE_TASKS,
#            default softmax rmsnorm), and the JAXBench baselines named below when a
#            JAXBench checkout is given
#   crowned  the same for every CROWNED_DIR/<task>/crowned.py (kernels a search crowned
#            off a TPU, beside their task's files: benchmarks/search_quality/
#            jaxbench_offline.py --keep RUN --crowned-out CROWNED_DIR writes them): their
#            device time against XLA's
#            (CROWNED_ONLY="NAME ...": those tasks, in that order)
# Each step's time limit: EVAL_TIMEOUT, TESTS_TIMEOUT, AUTO_TIMEOUT (per task), MEASURE_TIMEOUT,
# CROWNED_TIMEOUT. Each step's output goes to OUTDIR/<step>.log; the measured rows to OUTDIR/measured.jsonl,
# the sessions of `auto` under OUTDIR/sessions.
set -u
out=${1:?usage: tpu_checks.sh OUTDIR [JAXBENCH_BENCHMARK_DIR] [CROWNED_DIR]}
jb=${2:-}
crowned=${3:-}
steps=${STEPS:-eval tests commands auto measure crowned}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3 PYTHONFAULTHANDLER=1
step() {
  local t=$1 name=$2; shift 2
  echo "=== $name ($(date +%T))"
  # SIGABRT at the limit: Python's fault handler prints where every thread of it was
  timeout -s ABRT -k 15 "$t" "$@" > "$out/$name.log" 2>&1
  echo "=== $name rc=$? ($(date +%T))"
  tail -c 700 "$out/$name.log"
}
for s in $steps; do
  case $s in
    # the default deadline, 120 s a phase: the JSON's extra.phases says where the time went,
    # and a timeout names the last finished phase (the whole eval outran 120 s, 2026-12-06)
    eval) step "${EVAL_TIMEOUT:-400}" eval_gelu python -m tilewright.tui.cli eval --task gelu \
            --json ;;
    tests) step "${TESTS_TIMEOUT:-300}" tests env TILEWRIGHT_TPU_TESTS=1 python -m pytest -q -p no:cacheprovider \
             tests/test_on_tpu.py ;;
    commands)
      tw="python -m tilewright.tui.cli"
      step 300 estimate $tw estimate --task softmax --json
      step 300 profile $tw profile --task softmax --iters 5
      step 400 calibrate $tw calibrate --task softmax --json
      step 400 auto_softmax $tw auto --task softmax --agent offline --budget 3 \
        --session-dir "$out/cmd_sessions" --json
      session=$(ls -t "$out/cmd_sessions" 2>/dev/null | head -1)
      if [ -n "$session" ]; then
        step 400 replay_verify $tw replay "$session" --session-dir "$out/cmd_sessions" --verify
        step 300 export $tw export "$session" --session-dir "$out/cmd_sessions" \
          -o "$out/softmax_best.py" --test "$out/test_softmax_best.py"
        step 300 export_test python -m pytest -q -p no:cacheprovider "$out/test_softmax_best.py"
      fi ;;
    auto)
      for task in ${AUTO_TASKS:-causal_attention matmul_bias_gelu}; do
        step "${AUTO_TIMEOUT:-240}" "auto_$task" python -m tilewright.tui.cli auto --task "$task" \
          --agent offline --budget "${AUTO_BUDGET:-6}" --session-dir "$out/sessions" --json
      done ;;
    measure)
      programs=()
      for task in ${MEASURE_TASKS:-softmax rmsnorm}; do programs+=("bundled:$task"); done
      if [ -n "$jb" ]; then
        for name in 9p_SwiGLU_MLP 12p_RMSNorm 41k_Gemm_Add_ReLU 13p_Cross_Entropy 8p_GEMM \
            1p_Flash_Attention 5p_Flex_Attention; do
          programs+=("$jb/$name")
        done
      fi
      step "${MEASURE_TIMEOUT:-400}" measure python benchmarks/on_chip/measure_on_chip.py "${programs[@]}" --points 6 \
        --budget 1 --out "$out/measured.jsonl" ;;
    crowned)
      [ -n "$crowned" ] || { echo "=== crowned: no CROWNED_DIR given"; continue; }
      programs=()
      for name in ${CROWNED_ONLY:-$(ls "$crowned")}; do  # CROWNED_ONLY: these, in order
        [ -f "$crowned/$name/crowned.py" ] && programs+=("$crowned/$name:crowned.py")
      done
      step "${CROWNED_TIMEOUT:-450}" crowned python benchmarks/on_chip/measure_on_chip.py "${programs[@]}" \
        --budget 1 --out "$out/crowned.jsonl" ;;
    *) echo "=== unknown step $s" ;;
  esac
done
