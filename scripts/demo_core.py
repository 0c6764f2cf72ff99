"""A small demo of the capture core: an MLP with an eager softmax break, captured and replayed.

Runs eagerly, and says so, where there is no CUDA device.
"""

import time

import torch

import bcg_diffusion as bcg


@bcg.eager_on_graph
def attention_like(h: torch.Tensor) -> torch.Tensor:
    return torch.softmax(h, dim=-1)


def step(x: torch.Tensor, w: torch.Tensor, depth: int = 12) -> torch.Tensor:
    h = x
    for _ in range(depth):
        h = torch.nn.functional.gelu(h @ w)
        h = h + attention_like(h)
    return h


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    w = torch.randn(256, 256, device=device) / 16
    x = torch.randn(8, 256, device=device)
    if device == "cpu":
        print("No CUDA device: running the demo eagerly (breakable CUDA graphs need a CUDA GPU).")
        print("eager output checksum:", float(step(x, w).sum()))
        return
    graph = bcg.BreakableCUDAGraph()
    t0 = time.perf_counter()
    with bcg.BreakableCUDAGraphCapture(graph):
        out = step(x, w)
    print(f"captured {graph!r} in {1e3 * (time.perf_counter() - t0):.1f} ms")
    x.normal_()
    graph.replay()
    print("replay equals eager:", torch.equal(out, step(x, w)))


if __name__ == "__main__":
    main()
