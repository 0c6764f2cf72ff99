"""Regional compile + BCG set-up with a compile cache: run it twice with the same --cache folder.

Each run builds the family's full transformer (bf16, random weights), calls
``bcg_diffusion.use_compile_cache(--cache)``, compiles the blocks regionally, accelerates, and times
the set-up: from before compiling to the end of the second call of the transformer (compile, the
key's eager first call and its capture). A second process with the same folder measures a warm start.
Prints one JSON line.

    python scripts/compile_cache_check.py --family pixart --cache /tmp/cc   # cold
    python scripts/compile_cache_check.py --family pixart --cache /tmp/cc   # warm
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.speedups import regional_compile

from .capture_profile import image_call, transformer_inputs


def dynamo_phases() -> dict[str, float]:
    """Seconds torch.compile spent per phase in this process (dynamo's own compile-time metrics)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {f"dynamo.{name}": round(sum(values), 3) for name, values in compilation_time_metrics.items()
            if sum(values) >= 0.01}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="pixart")
    p.add_argument("--size", default="512x512")
    p.add_argument("--cache", required=True)
    args = p.parse_args(argv)
    t_load = time.perf_counter()
    cache = bcg_diffusion.use_compile_cache(args.cache)
    load_s = time.perf_counter() - t_load
    h, w = map(int, args.size.split("x"))
    pipe = pipelines.build_pipeline(args.family, size="full", device="cuda", dtype=torch.bfloat16, seed=0)
    pipe.set_progress_bar_config(disable=True)
    call = image_call(pipe, {"family": args.family, "height": h, "width": w, "frames": None}, 2)
    inputs, kwargs = transformer_inputs(pipe, call)
    model = pipe.transformer
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    regional_compile(model, fullgraph=True, dynamic=False)
    bcg_diffusion.accelerate_transformer(model, bcg_diffusion.BCGConfig())
    wrapped = time.perf_counter()
    with torch.inference_mode():
        model(*inputs, **kwargs)
        torch.cuda.synchronize()
        first = time.perf_counter()
        out = model(*inputs, **kwargs)[0]
    torch.cuda.synchronize()
    setup = time.perf_counter() - t0
    phases = {"cache_load_s": load_s, "compile_and_accelerate_s": wrapped - t0,
              "first_call_s": first - wrapped, "second_call_s": t0 + setup - first}
    with torch.inference_mode():
        times = []
        for _ in range(10):
            torch.cuda.synchronize()
            t = time.perf_counter()
            model(*inputs, **kwargs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    saved = cache.save()
    stats = bcg_diffusion.get_stats(model)
    phases = {name: round(value, 3) for name, value in phases.items()}
    phases.update(dynamo_phases())
    print(json.dumps({"family": args.family, "size": args.size, "status": cache.status.split(":")[0],
                      "status_text": cache.status, "setup_s": round(setup, 3),
                      "call_ms": round(1e3 * sorted(times)[5], 3), "captures": stats.captures, "phases": phases,
                      "finite": bool(torch.isfinite(out).all()), "saved": str(saved)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
