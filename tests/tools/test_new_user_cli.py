"""What a new user runs into with ``scripts/generate.py`` on a CPU (issue 30), one test per point.

Bad arguments exit with code 2 and one clear line before anything is built (the ``no_build`` fixture fails a
test that reaches a build); the runs use the tiny pipelines with 1-2 steps. The numbers in the section titles
are the issue's.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bcg_diffusion.cli import generate
from bcg_diffusion.toolkit import media, options

ROOT = Path(__file__).resolve().parents[2]
CPU_ONLY = pytest.mark.usefixtures("hide_cuda")  # the no-CUDA path of the command (CUDA hidden where present)


def usage_error(capsys, argv: list[str]) -> str:
    """Run the command, expect exit code 2, return its last stderr line (the reason)."""
    assert generate.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("generate.py: error: "), err
    return err[-1]


# -- 1. --out x.mp4 writes a file: the MP4, or the GIF the help promises --------------------------------------
def test_mp4_without_a_writer_writes_the_gif_and_says_so_before_building(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(media, "can_write_mp4", lambda: False)
    out = tmp_path / "wan.mp4"
    assert generate.main(["--model", "wan", "--steps", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    gif = tmp_path / "wan.gif"
    note = f"note: --out {out}: no MP4 writer is installed, so the video is written as the GIF {gif}"
    assert note in text and text.index(note) < text.index("building wan"), text
    assert 'pip install -e ".[video]"' in text
    assert gif.read_bytes()[:6] == b"GIF89a" and not out.exists()
    assert f"wrote {gif}" in text


def test_mp4_with_the_video_extra_is_an_mp4(tmp_path, capsys):
    assert media.can_write_mp4()  # the video extra (imageio + imageio-ffmpeg) is in the test extra
    out = tmp_path / "wan.mp4"
    assert generate.main(["--model", "wan", "--steps", "1", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_bytes()[4:8] == b"ftyp"  # an ISO media file


def test_a_failing_mp4_writer_keeps_the_video_as_a_gif(tmp_path, monkeypatch):
    def broken(frames, target, fps):
        target.write_bytes(b"partial")
        raise RuntimeError("ffmpeg exited with code 1")

    monkeypatch.setattr(media, "_write_mp4", broken)
    notes: list[str] = []
    video = [[[[[0.5, 0.5, 0.5]] * 16] * 16] * 3]  # one video of 3 frames, 16x16, RGB in [0, 1]
    written = media.save_output(video, tmp_path / "v.mp4", True, 8, notes=notes)
    assert written == [tmp_path / "v.gif"] and (tmp_path / "v.gif").read_bytes()[:6] == b"GIF89a"
    assert not (tmp_path / "v.mp4").exists()
    assert len(notes) == 1 and "ffmpeg exited with code 1" in notes[0] and "wrote the GIF" in notes[0]


# -- 4. --out on a virtual filesystem is refused; a missing folder is created, and the command says so --------
@pytest.mark.skipif(not Path("/proc/self/mounts").exists(), reason="Linux: /proc and /sys")
@pytest.mark.parametrize("out", ["/proc/x.png", "/sys/x.png", "/proc/sub/dir/x.png"])
def test_out_on_proc_or_sys_exits_2_before_building(capsys, no_build, out):
    reason = usage_error(capsys, ["--out", out])
    assert f"--out '{out}' cannot be written" in reason
    assert re.search(r"is on a (proc|sysfs) filesystem", reason), reason


def test_out_in_a_missing_folder_says_it_creates_it(tmp_path, capsys):
    out = tmp_path / "new" / "dir" / "fox.png"
    assert generate.main(["--steps", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    note = f"note: --out {out}: the folder {out.parent} does not exist; it is created when the output is written"
    assert note in text and text.index(note) < text.index("building flux"), text
    assert out.is_file()


# -- 5. one size convention: width x height, labelled ----------------------------------------------------------
def test_list_models_labels_sizes_width_first(capsys):
    assert generate.main(["--list-models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert "(WxH)" in lines[0] and "max side px" in lines[0], lines[0]
    wan = next(line for line in lines if line.startswith("wan "))
    assert "832x480, 81 frames" in wan and "32x32, 9 frames" in wan, wan  # Wan 2.1: 832 wide, 480 high
    assert "width x height" in lines[-1]
    assert header[0] == "family"


def test_the_summary_and_warmup_write_width_first(tmp_path, capsys):
    out = tmp_path / "wide.png"
    assert generate.main(["--height", "48", "--width", "80", "--steps", "1", "--warmup", "80x48",
                          "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bcg_diffusion.warmup at 80x48 (WxH)" in text, text
    assert "size: asked 80x48 px (WxH)" in text, text
    from PIL import Image

    assert Image.open(out).size == (80, 48)


# -- 6. --guidance and the image size are bounded ------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5", "1e9"])
def test_guidance_out_of_range_exits_2(capsys, no_build, value):
    reason = usage_error(capsys, [f"--guidance={value}"])
    finite = value not in ("nan", "inf", "-inf")  # those the option's type refuses (issue 50: every float option)
    needle = "--guidance must be a number in 0 .. 10000" if finite else f"argument --guidance: '{value}' is not a finite number"
    assert needle in reason, reason


@pytest.mark.parametrize("argv, limit", [(["--height", "16384", "--width", "16384"], 4096),
                                         (["--width", "4112"], 4096),
                                         (["--model", "qwenimage", "--height", "5328"], 5312)])
def test_height_and_width_above_the_family_limit_exit_2(capsys, no_build, argv, limit):
    reason = usage_error(capsys, argv)
    assert f"is above the limit of {limit} px" in reason, reason


def test_the_size_limit_is_the_documented_one():
    import bcg_pipelines as pipelines

    from bcg_diffusion.toolkit.model_limits import max_side

    for name in pipelines.list_families():
        spec = pipelines.get_family(name)
        limit = max_side(spec)
        assert limit >= 4096 and limit >= 4 * max(spec.full.width, spec.full.height) - spec.spatial_multiple
        assert limit % spec.spatial_multiple == 0
    assert max_side(None) == 4096


# -- 7. --compare on a CPU reports no speed-up ---------------------------------------------------------------
@CPU_ONLY
def test_compare_on_cpu_reports_no_speedup(tmp_path, capsys):
    assert generate.main(["--compare", "--steps", "2", "--out", str(tmp_path / "c.png")]) == 0
    text = capsys.readouterr().out
    assert "per-step speedup: none: BCG is inactive (" in text, text
    assert "(no speed-up to expect: both runs were eager on this machine)" in text, text
    assert not re.search(r"speedup.*\d\.\d\dx", text), text
    assert "BCG: FluxTransformer2DModel: not accelerated" in text, text
    assert "outputs bitwise identical: YES" in text


# -- 8. --device: cuda, cuda:N or cpu, refused in one line otherwise -----------------------------------------
@pytest.mark.parametrize("device, needle", [("mps", "not on mps"), ("meta", "not on meta"),
                                            ("xpu:0", "not on xpu"), ("no-such-device", "is not a device name")])
def test_unsupported_device_exits_2_in_one_line(capsys, no_build, device, needle):
    assert generate.main(["--device", device]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    reasons = [line for line in err if not line.startswith(("usage:", " "))]  # argparse's usage, then one line
    assert reasons == [err[-1]] and err[-1].startswith("generate.py: error: --device"), err
    assert needle in err[-1] and "use cuda, cuda:N or cpu" in err[-1], err[-1]
    assert "running eagerly" not in err[-1]


@CPU_ONLY
def test_cuda_without_a_gpu_exits_2(capsys, no_build):
    assert "torch sees no CUDA device" in usage_error(capsys, ["--device", "cuda"])


# -- 11. the smaller points -----------------------------------------------------------------------------------
def test_missing_model_path_exits_2_before_building(tmp_path, capsys, no_build):
    reason = usage_error(capsys, ["--model", "/no/such/pipeline"])
    assert "--model /no/such/pipeline: no such folder" in reason
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no diffusers pipeline (no model_index.json)" in usage_error(capsys, ["--model", str(empty)])
    (tmp_path / "file").write_text("x")
    assert "is a file" in usage_error(capsys, ["--model", str(tmp_path / "file")])


def test_attention_backend_without_its_package_exits_2_before_building(capsys, no_build, monkeypatch):
    from diffusers.models import attention_dispatch

    monkeypatch.setattr(attention_dispatch, "_CAN_USE_FLASH_ATTN", False)  # as where flash-attn is not installed
    reason = usage_error(capsys, ["--attention-backend", "flash"])
    assert "--attention-backend flash:" in reason and "flash-attn" in reason, reason


def test_offline_hub_id_exits_2_and_says_how_to_pass_a_folder(capsys, no_build, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    reason = usage_error(capsys, ["--model", "no-org/no-model"])
    assert "not in the local Hugging Face cache, and the Hub is offline" in reason, reason
    assert "--model /path/to/no-model" in reason and "stacktrace" not in reason


def test_a_failed_hub_load_is_one_sentence_with_the_fix():
    error = OSError("could not load pipeline 'org/name': ... Please check out the root cause in the stacktrace above.")
    hint = options.offline_hint("org/name", error)
    assert hint.startswith("could not load org/name: it is not a local folder, not in the local Hugging Face cache")
    assert "--model /path/to/name" in hint and "stacktrace" not in hint
    assert options.offline_hint("org/name", RuntimeError("CUDA error")) is None
    assert options.offline_hint("flux", error) is None


def test_known_harmless_library_messages_are_dropped_and_others_kept(caplog):
    from bcg_diffusion import known_messages

    options.quiet_known_messages()
    options.quiet_known_messages()  # twice: one filter (import bcg_diffusion installed it already)
    logger = logging.getLogger("transformers.utils.import_utils")
    assert sum(isinstance(f, known_messages._DropKnown) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING):
        logger.warning("`CLIPImageProcessor` requires torchvision (not installed); falling back to `X`")
        logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


@CPU_ONLY
def test_bench_e2e_on_cpu_does_not_say_with_capture():
    import bcg_pipelines as pipelines

    from bcg_diffusion.benchmarks.step.e2e_row import run_e2e
    from bcg_diffusion.benchmarks.timing import Clock

    pipe = pipelines.build_pipeline("flux", "tiny", device="cpu")
    lines: list[str] = []
    call = {"prompt": "x", "num_inference_steps": 1, "height": 32, "width": 32}
    res = run_e2e(pipe, call, 0, Clock(False), lines.append)
    bcg_line = next(line for line in lines if "e2e bcg:" in line)
    assert "with capture" not in bcg_line and "nothing is captured" in bcg_line, lines
    assert res["bcg_stats"] is None and "no-op" in res["note"]


@CPU_ONLY
@pytest.mark.parametrize("name", ["fp8", "fp8wo"])
def test_float8_quant_without_cuda_exits_2_before_building(capsys, no_build, name):
    reason = usage_error(capsys, ["--quant", name])
    assert "need a CUDA GPU of compute capability 8.9 or newer" in reason and "int8wo" in reason, reason


def test_out_that_is_a_folder_says_so(tmp_path, capsys, no_build):
    reason = usage_error(capsys, ["--out", str(tmp_path)])
    assert f"--out '{tmp_path}' cannot be written: it is a folder; give a file in it, e.g. --out " in reason
    assert str(tmp_path / "flux.png") in reason


# -- --help answers before torch is imported (the command's "under 1 s") ---------------------------------------
HELP_IMPORTS = textwrap.dedent("""
    import json, runpy, sys
    sys.argv = ["generate.py", "--help"]
    try:
        runpy.run_path(sys.argv_path, run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0, exc.code
    heavy = ["torch", "numpy", "diffusers", "transformers", "PIL", "bcg_pipelines", "bcg_diffusion.accelerate"]
    print(json.dumps([name for name in heavy if name in sys.modules]))
""").replace("sys.argv_path", repr(str(ROOT / "scripts" / "generate.py")))


def test_generate_help_imports_neither_torch_nor_diffusers():
    out = subprocess.run([sys.executable, "-c", HELP_IMPORTS], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    *usage, imported = out.stdout.strip().splitlines()
    assert usage[0].startswith("usage: generate.py"), usage[:3]
    assert json.loads(imported) == [], f"--help imported {imported}"


def test_the_light_choices_agree_with_the_pipelines():
    import bcg_pipelines as pipelines

    from bcg_diffusion.toolkit import choices

    assert choices.SIZES == pipelines.SIZES
    assert choices.DTYPE_NAMES == pipelines.DTYPE_NAMES


# -- the package root is lazy, and every public name still works ---------------------------------------------
LAZY_ROOT = textwrap.dedent("""
    import importlib.abc, sys

    class NoCudaBindings(importlib.abc.MetaPathFinder):  # a CPU-only machine may not have cuda-bindings
        def find_spec(self, name, path=None, target=None):
            if name == "cuda" or name.startswith("cuda."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoCudaBindings())
    import bcg_diffusion
    assert "torch" not in sys.modules, "import bcg_diffusion imported torch"
    assert set(bcg_diffusion.__all__) <= set(dir(bcg_diffusion))
    import bcg_diffusion.warmup  # the submodule of the same name first: the name stays the function
    assert callable(bcg_diffusion.warmup) and bcg_diffusion.warmup.__module__ == "bcg_diffusion.warmup"
    from bcg_diffusion import accelerate_pipeline, get_stats, warmup
    assert warmup is bcg_diffusion.warmup and accelerate_pipeline is bcg_diffusion.accelerate_pipeline
    for name in bcg_diffusion.__all__:
        assert getattr(bcg_diffusion, name) is not None, name
    namespace = {}
    exec("from bcg_diffusion import *", namespace)
    assert set(bcg_diffusion.__all__) <= set(namespace)
    saved = bcg_diffusion.get_stats
    del bcg_diffusion.get_stats  # as after an eager import, a deleted name stays absent (monkeypatch.delattr)
    assert not hasattr(bcg_diffusion, "get_stats")
    bcg_diffusion.get_stats = saved
    try:
        bcg_diffusion.no_such_name
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")
    assert not any(m == "cuda" or m.startswith("cuda.") for m in sys.modules)
    print("ok")
""")


def test_package_root_is_lazy_and_keeps_every_public_name():
    out = subprocess.run([sys.executable, "-c", LAZY_ROOT], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
