#!/usr/bin/env bash
# The one-GPU context-parallel harness tests (issue 31): two ranks on cuda:0 under gloo.
#
#   OUT=/some/folder bash tests/library/run_cp_gpu.sh
#
# Run from the repository root, after diffusers, transformers, peft (for the LoRA cases) and pytest
# are importable. About 4 minutes on an H200; every process is bounded (each torchrun launch by the
# test's own timeout, which kills its process group; pytest by `timeout`). Writes under $OUT:
#   env.txt        GPU, torch, diffusers, peft versions
#   pytest.log     the test run (-rA: every test's outcome)
#   junit.xml      the same, machine-readable
#   summary.json   counts of passed / failed / skipped / errors, the exit code, seconds
#   cp_reports/    every rank's report (one_gpu_main/rank<N>.json, one_gpu_fault/rank<N>.json) and
#                  each launch's output (launch.log)
# Optional: CP_FULL=1 adds full-size Flux.1-dev and Wan 2.1 1.3B (one more launch, up to 9 minutes).
set -u
: "${OUT:?set OUT to the output folder}"
export OUT
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export BCG_CP_REPORT_DIR="$OUT/cp_reports"
mkdir -p "$OUT" "$BCG_CP_REPORT_DIR"
start=$(date +%s)

{
  nvidia-smi --query-gpu=name,memory.used,memory.total,compute_mode --format=csv 2>&1
  timeout -k 5 40 python - <<'EOF' 2>&1
import importlib
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
for name in ("diffusers", "transformers", "peft", "pytest"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # noqa: BLE001
        print(name, "MISSING:", exc)
EOF
} > "$OUT/env.txt"
cat "$OUT/env.txt"

selection=(-m "gpu and not cp_full")
limit=230
if [ "${CP_FULL:-0}" = "1" ]; then
  export BCG_CP_FULL=1
  selection=(-m gpu)
  limit=590
fi
timeout -k 10 "$limit" python -m pytest -q -rA -p no:cacheprovider "${selection[@]}" \
  tests/library/test_context_parallel_one_gpu.py --junitxml "$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
rc=$?
echo "pytest exit code $rc after $(( $(date +%s) - start )) s" >> "$OUT/pytest.log"
tail -n 80 "$OUT/pytest.log"

RC=$rc START=$start timeout -k 5 30 python - <<'EOF' > "$OUT/summary.json" 2>&1
import json, os, time
import xml.etree.ElementTree as ET
summary = {"exit_code": int(os.environ["RC"]), "seconds": round(time.time() - int(os.environ["START"]))}
try:
    suite = ET.parse(os.path.join(os.environ["OUT"], "junit.xml")).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    summary.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    summary["failed"] = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
except Exception as exc:  # noqa: BLE001
    summary["junit"] = f"unreadable: {exc}"
print(json.dumps(summary, indent=1))
EOF
cat "$OUT/summary.json"
exit $rc
