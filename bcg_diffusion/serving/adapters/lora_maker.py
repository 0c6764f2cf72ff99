"""Write random LoRA adapters for a family's transformer (diffusers LoRA safetensors), for serving tests and load runs.

    python scripts/make_loras.py --model sana --size full --out /tmp/loras --ranks 16,16,8,4

writes ``/tmp/loras/lora1`` .. ``lora4`` (each a folder with ``pytorch_lora_weights.safetensors``, as
``pipe.save_lora_weights`` writes it) and prints the ``bcg-serve`` options that serve them
(``--lora lora1=/tmp/loras/lora1 ...``) as its last line. The transformer is built on the meta device: no
weights are made, seconds even for a published-size model. The files come from :mod:`bcg_pipelines.lora_files`;
``scripts/make_loras.py`` runs this module's :func:`main`.
"""

from __future__ import annotations

import argparse
import shlex
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="make_loras.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="flux", help="a family of bcg_pipelines whose transformer takes LoRA (default: flux)")
    p.add_argument("--size", default="tiny", choices=("tiny", "full"), help="model size (default: tiny)")
    p.add_argument("--out", required=True, help="folder for the adapters (one sub-folder each)")
    p.add_argument("--ranks", default="16,16,16,16", help="one rank per adapter (default: 16,16,16,16)")
    p.add_argument("--prefix", default="lora", help="adapter names: PREFIX1, PREFIX2, ... (default: lora)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first adapter; the next get seed+1, ...")
    return p


def _usage_error(p: argparse.ArgumentParser, message: str) -> int:
    p.print_usage(sys.stderr)
    print(f"{p.prog}: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2)
        return int(exc.code or 0)
    try:
        ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        return _usage_error(p, f"--ranks {args.ranks!r}: give whole numbers separated by commas, e.g. 16,8")
    if not ranks or min(ranks) < 1:
        return _usage_error(p, "--ranks: every rank must be >= 1")
    from bcg_pipelines import list_families, lora_files

    if args.model not in list_families():
        return _usage_error(p, f"--model {args.model!r}: choose one of {', '.join(list_families())}")
    options = []
    for i, rank in enumerate(ranks, start=1):
        name = f"{args.prefix}{i}"
        try:
            path = lora_files.write_family_lora(args.model, args.size, f"{args.out}/{name}", rank, seed=args.seed + i - 1)
        except ValueError as exc:
            print(f"make_loras.py: error: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: rank {rank} -> {path}", flush=True)
        options += ["--lora", f"{name}={path.parent}"]
    print(shlex.join(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
