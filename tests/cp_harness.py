"""Two ranks on one GPU: the test harness of BCG under diffusers context parallelism.

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so the harness runs every rank on
``cuda:0`` in its own process, under gloo (which moves CUDA tensors through host memory). It is for
exactness and lockstep, not speed. Set-up: :func:`init_ranks`; launch: :func:`launch` (torchrun,
bounded, its whole process group killed on a timeout).

Test-side workaround, never in what users run: under gloo, diffusers' output gather segfaulted in
torch's functional collective ``wait_tensor``. :class:`Collectives` replaces torch's functional
``all_gather_tensor`` and ``all_to_all_single`` (the collectives diffusers' context parallelism
uses: Ulysses attention, ring attention, the output gather) with synchronous c10d collectives into
preallocated tensors. The stand-ins also

- refuse to run under a breakable capture (:class:`CollectiveUnderCapture`): BCG must never
  capture a collective or run one while capturing;
- stop waiting when another rank aborted (they poll
  :func:`bcg_diffusion.integration.parallel.raise_if_peer_aborted`), and after
  ``collective_timeout_s`` in any case;
- can raise an :class:`InjectedFault` on this rank at a chosen collective (:meth:`Collectives.arm_fault`).

Importing this module has no side effects; clocks and sleeps are injectable (CPU tests).
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ROOT = Path(__file__).resolve().parents[1]
REPLACED = ("all_gather_tensor", "all_to_all_single")


class InjectedFault(RuntimeError):
    """The fault a test asked for (:meth:`Collectives.arm_fault`)."""


class CollectiveUnderCapture(RuntimeError):
    """A collective ran while a breakable capture was active: BCG must keep collectives in eager
    breaks that run at replay."""


@dataclass(frozen=True)
class HarnessConfig:
    """How the stand-in collectives wait.

    Attributes:
        collective_timeout_s: a collective that has not completed after this long raises
            ``TimeoutError`` naming the rank and the collective (the process group's own timeout
            is the backstop).
        abort_poll_s: how often a waiting collective checks whether another rank aborted.
        replace: which functional collectives are replaced (names in
            ``torch.distributed._functional_collectives``); the others are observed: torch's own
            run, after the capture check, the count and the injected fault.
    """

    collective_timeout_s: float = 60.0
    abort_poll_s: float = 0.005
    replace: tuple[str, ...] = REPLACED

    def __post_init__(self) -> None:
        unknown = [n for n in self.replace if n not in REPLACED]
        if unknown:
            raise ValueError(f"HarnessConfig.replace: can replace {REPLACED}, got {unknown}")
        if not (self.collective_timeout_s > 0 and self.abort_poll_s > 0):
            raise ValueError("HarnessConfig: collective_timeout_s and abort_poll_s must be > 0")


def _process_group(group: Any) -> Any:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(group, dist.ProcessGroup):
        return group
    if isinstance(group, DeviceMesh) and group.ndim == 1:
        return group.get_group()
    if isinstance(group, str):
        return dist.distributed_c10d._resolve_process_group(group)
    raise TypeError(f"cp_harness collectives take a ProcessGroup, a 1-D DeviceMesh or a group name, got {type(group).__name__}")


def _peer_check() -> Callable[[], None]:
    from bcg_diffusion.integration.parallel import raise_if_peer_aborted

    return raise_if_peer_aborted


class Collectives:
    """Synchronous, abort-aware stand-ins for torch's functional collectives (module docstring)."""

    def __init__(
        self,
        config: HarnessConfig,
        rank: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        check_peers: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.rank = rank
        self.clock = clock
        self.sleep = sleep
        self.check_peers = check_peers if check_peers is not None else _peer_check()
        self.count = 0  # collectives run by the stand-ins
        self._fault_in: int | None = None
        self._originals: dict[str, Callable] = {}

    # -- installing -----------------------------------------------------------------------
    def install(self) -> Callable[[], None]:
        """Replace the configured functional collectives and observe the others; returns the undo."""
        import torch.distributed._functional_collectives as funcol

        if self._originals:
            raise RuntimeError("cp_harness.Collectives.install: already installed")
        for name in REPLACED:
            original = getattr(funcol, name)
            self._originals[name] = original
            setattr(funcol, name, getattr(self, name) if name in self.config.replace else self._observer(name, original))

        def undo() -> None:
            for name, original in self._originals.items():
                setattr(funcol, name, original)
            self._originals.clear()

        return undo

    def _observer(self, name: str, original: Callable) -> Callable:
        def observed(self_tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self._before(f"{name} of {list(self_tensor.shape)} (torch's)")
            return original(self_tensor, *args, **kwargs)

        return observed

    def arm_fault(self, after: int) -> None:
        """The ``after``-th collective from now (1: the next) raises :class:`InjectedFault` on this rank."""
        if after < 1:
            raise ValueError(f"arm_fault: after must be >= 1, got {after}")
        self._fault_in = after

    # -- the collectives ------------------------------------------------------------------
    def all_gather_tensor(self, self_tensor: Any, gather_dim: int, group: Any, tag: str = "") -> Any:
        """``funcol.all_gather_tensor``: the ranks' tensors concatenated along ``gather_dim``."""
        import torch
        import torch.distributed as dist

        what = f"all_gather of {list(self_tensor.shape)} along dim {gather_dim}"
        self._before(what)
        pg = _process_group(group)
        x = self_tensor.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(pg))]
        self.wait(dist.all_gather(parts, x, group=pg, async_op=True), what)
        return torch.cat(parts, dim=gather_dim)

    def all_to_all_single(self, self_tensor: Any, output_split_sizes: Any, input_split_sizes: Any, group: Any, tag: str = "") -> Any:
        """``funcol.all_to_all_single`` with even splits (uneven ones go to torch's own)."""
        import torch
        import torch.distributed as dist

        if output_split_sizes is not None or input_split_sizes is not None:
            return self._originals["all_to_all_single"](self_tensor, output_split_sizes, input_split_sizes, group, tag)
        what = f"all_to_all of {list(self_tensor.shape)}"
        self._before(what)
        pg = _process_group(group)
        x = self_tensor.contiguous()
        out = torch.empty_like(x)
        self.wait(dist.all_to_all_single(out, x, group=pg, async_op=True), what)
        return out

    # -- waiting --------------------------------------------------------------------------
    def _before(self, what: str) -> None:
        from bcg_diffusion.core.active_capture import ACTIVE_CAPTURE

        state = ACTIVE_CAPTURE.get()
        if state is not None and not getattr(state, "debug", False):
            raise CollectiveUnderCapture(f"rank {self.rank}: {what} ran during a breakable capture")
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
            raise CollectiveUnderCapture(f"rank {self.rank}: {what} ran while the current stream captures a CUDA graph")
        self.count += 1
        if self._fault_in is not None:
            self._fault_in -= 1
            if self._fault_in == 0:
                self._fault_in = None
                raise InjectedFault(f"injected fault on rank {self.rank} in {what} (collective {self.count})")

    def wait(self, work: Any, what: str) -> None:
        """Wait for ``work``, checking every ``abort_poll_s`` whether another rank aborted (raises
        its ``RankAbortedError``) and giving up after ``collective_timeout_s`` (``TimeoutError``)."""
        start = self.clock()
        deadline = start + self.config.collective_timeout_s
        next_check = start
        pause = 0.00005
        while not _done(work):
            now = self.clock()
            if now >= next_check:
                self.check_peers()
                next_check = now + self.config.abort_poll_s
            if now >= deadline:
                raise TimeoutError(
                    f"rank {self.rank}: {what} did not complete within {self.config.collective_timeout_s:g} s "
                    "(another rank crashed or makes other collectives)"
                )
            self.sleep(pause)
            pause = min(pause * 2, 0.001)
        work.wait()


def _done(work: Any) -> bool:
    """Whether ``work`` completed: its own flag, or its future's (whichever the backend keeps)."""
    if work.is_completed():
        return True
    try:
        future = work.get_future()
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return future.done()


# -- ranks and launches -----------------------------------------------------------------------
def init_ranks(kind: str, timeout_s: float) -> Any:
    """Join the torchrun job; returns this rank's device. ``kind``: ``"one-gpu"`` (every rank on
    ``cuda:0``, gloo), ``"nccl"`` (one GPU per rank), ``"cpu"`` (gloo on the CPU)."""
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    if kind == "one-gpu":
        if not torch.cuda.is_available():
            raise SystemExit("cp_harness: --one-gpu needs a CUDA device")
        torch.cuda.set_device(0)
        # Initialise CUDA now: init_device_mesh sets the device from LOCAL_RANK (1 on the second rank,
        # which does not exist here) when it finds CUDA uninitialised.
        torch.cuda.init()
        torch.zeros(1, device="cuda:0")
        dist.init_process_group("gloo", timeout=timeout)
        return torch.device("cuda", 0)
    if kind == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        return device
    if kind == "cpu":
        # diffusers computes rank % torch.accelerator.device_count(), which is 0 without an accelerator
        torch.accelerator.device_count = lambda: 1
        dist.init_process_group("gloo", timeout=timeout)
        return torch.device("cpu")
    raise ValueError(f"init_ranks: kind is 'one-gpu', 'nccl' or 'cpu', got {kind!r}")


def launch_env(base: dict | None = None) -> dict:
    """``base`` (default: this environment) with NVLink multicast off and the repository importable."""
    env = dict(os.environ if base is None else base)
    env.update(MULTICAST_OFF)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def torchrun_command(script: str | os.PathLike, *args: str, nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script), *args]


@dataclass
class Launch:
    returncode: int | None  # None: killed at the timeout
    output: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def launch(command: list[str], timeout_s: float, env: dict | None = None, log_path: Path | None = None) -> Launch:
    """Run ``command`` in its own process group; kill the whole group after ``timeout_s``. Never hangs."""
    start = time.monotonic()
    proc = subprocess.Popen(command, env=launch_env(env), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    returncode: int | None
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank
        output, _ = proc.communicate()
        returncode = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(output)
    return Launch(returncode, output, time.monotonic() - start)
