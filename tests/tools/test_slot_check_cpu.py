"""The start-up batch check of request batching (serving/batching/slot_check.py) with a fake pipeline whose image
does or does not depend on its slot: a dependent size is unbatched and says so; an independent one stays batched."""

import concurrent.futures
from types import SimpleNamespace

import numpy as np
import pytest

from bcg_diffusion.serving.batching import slot_check
from bcg_diffusion.serving.batching.request_batching import BatchPolicy, BatchShapes
from bcg_diffusion.serving.requests import GenerationJob
from bcg_diffusion.toolkit.sizes import Size

SIZE = Size(64, 64)


class FakePipe:
    """Row ``i`` of its ``np`` output is a function of the row's prompt and seed, plus ``i`` where ``by_slot``."""

    def __init__(self, by_slot: bool):
        self.by_slot, self.calls = by_slot, []

    def __call__(self, prompt, generator, output_type, num_inference_steps=20, **kwargs):
        self.calls.append((list(prompt), output_type, num_inference_steps))
        rows = [len(p) * 1000 + g.initial_seed() + (i * 0.5 if self.by_slot else 0)
                for i, (p, g) in enumerate(zip(prompt, generator))]
        return SimpleNamespace(images=np.array(rows, dtype=np.float32)[:, None, None, None] * np.ones((1, 2, 2, 3)))


class FakeRunner:
    def __init__(self, pipe):
        self.pipe = pipe
        self.refreshed_after = []  # the pipeline calls made when the stats were refreshed

    def refresh_stats(self):
        self.refreshed_after.append(len(self.pipe.calls))

    def generator(self, seed):
        import torch
        return torch.Generator().manual_seed(seed)


class FakePlanner:
    def default_job(self, size, prompt="warm-up", model=None):
        return GenerationJob(prompt=prompt, size=size, n=1, steps=20, seed=7, guidance=None, negative_prompt=None,
                             call={"prompt": prompt, "num_inference_steps": 20, "height": size.height,
                                   "width": size.width, "num_images_per_prompt": 1})


class Worker:
    def submit(self, fn):
        future = concurrent.futures.Future()
        future.set_result(fn())
        return future


@pytest.mark.parametrize("by_slot", [False, True])
def test_the_batch_check_unbatches_a_size_whose_image_depends_on_its_slot(by_slot):
    pipe = FakePipe(by_slot)
    shapes = BatchShapes(pipe, BatchPolicy(max_batch=4, work_limit=0), granularity=8)
    planner = FakePlanner()
    runner = FakeRunner(pipe)
    lines, unbatched = slot_check.check_batched_sizes(runner, planner, shapes, [SIZE], Worker())
    call = planner.default_job(SIZE).call
    assert len(pipe.calls) == 2 and all(c[1] == "np" and c[2] == slot_check.CHECK_STEPS for c in pipe.calls)
    assert runner.refreshed_after == [2]  # /stats counts the check's calls: a request's counters start after them
    assert pipe.calls[0][0][0] == "slot check" and pipe.calls[1][0][3] == "slot check"  # slot 0, then the last slot
    if by_slot:
        assert shapes.rows(SIZE, call) == 1 and SIZE in shapes.unbatched and unbatched == [SIZE]
        assert "NOT batched" in lines[0] and "NOT batched" in shapes.describe(SIZE, call)
    else:
        assert shapes.rows(SIZE, call) == 4 and not shapes.unbatched and unbatched == []
        assert "passed" in lines[0]


def test_a_batch_check_that_cannot_run_unbatches_the_size():
    class Broken(FakePipe):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no np output")

    pipe = Broken(False)
    shapes = BatchShapes(pipe, BatchPolicy(max_batch=4, work_limit=0), granularity=8)
    runner = FakeRunner(pipe)
    lines, unbatched = slot_check.check_batched_sizes(runner, FakePlanner(), shapes, [SIZE], Worker())
    assert shapes.rows(SIZE, FakePlanner().default_job(SIZE).call) == 1 and unbatched == [SIZE]
    assert runner.refreshed_after == [0]
    assert "batch check failed (RuntimeError: no np output)" in lines[0]
