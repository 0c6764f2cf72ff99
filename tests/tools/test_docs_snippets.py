"""Every code block of README.md and docs/*.md runs on the CPU, or says why not (issue 30).

A block's fence info string says what it is; the first word is the language:

- ````python``, ````bash``: runs here, on the CPU (the default);
- ````LANG gpu-only``: needs a CUDA GPU (or full-size models): not run; Python must compile, and every command of
  a tool must have options its parser accepts;
- ````LANG not-run: REASON``: cannot run in a test (real weights, a server to talk to, the test suite itself, a
  fragment, too slow on a CPU): not run; the options of its tool commands are checked as for ``gpu-only``;
- ````text``: output shown as an example; ````json``: must parse.

A block without an info string, or with flags other than these, fails: say what it is.

How the blocks run, each in a fresh temporary folder that holds a link to ``scripts/`` (so ``outputs/`` is
written there): Python blocks are executed in-process in a fresh namespace, where a placeholder line
``NAME = ...`` (the docs' "your pipeline") binds NAME to the tiny random-weight Flux pipeline on the CPU, whose
default size is set to its tiny 64x64 px (a real pipeline's default is 1024 px: seconds instead of a minute
here). Bash blocks run line by line (``\\`` continues a line, ``&&`` chains): ``pip install ...`` is skipped
(the test runs in the installed environment; ``.ci/run`` runs the README's install in a fresh one), a line of
variable assignments only is accepted, and a tool command (``python scripts/NAME.py ARGS``, ``bcg-NAME ARGS``)
calls that tool's ``main(ARGS)`` in-process and must exit 0. Anything else in a runnable block fails: mark it.
An identical command runs once per session.

Quiet runs (issue 39): the README's main job and its Python example run as written in fresh processes (no CUDA
device), and so do the other runnable Python blocks (one process); stderr may hold only progress bars and the
no-GPU notice of ``accelerate_pipeline`` at the caller's line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from _scripts import MODULES

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "bash", "text", "json")
FENCE = re.compile(r"^```(.*)$")
PLACEHOLDER = re.compile(r"^(?P<indent>\s*)(?P<name>[A-Za-z_]\w*)\s*=\s*\.\.\.\s*(?P<comment>#.*)?$")
ASSIGNMENTS = re.compile(r"^(?:[A-Za-z_]\w*=\S*\s*)+$")
COMMANDS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
TINY_FLUX_PX = 64


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    language: str
    flag: str  # "", "gpu-only" or "not-run"
    reason: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, with their info strings read (``ValueError`` for a malformed one)."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        info, start = match[1].strip(), i + 1
        end = next(j for j in range(start, len(lines)) if lines[j].startswith("```"))
        language, _, rest = info.partition(" ")
        flag, _, reason = rest.strip().partition(":")
        found.append(Block(page, start, language, flag.strip(), reason.strip(), "\n".join(lines[start:end]) + "\n"))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def block_id(block: Block) -> str:
    return f"{block.where}:{block.language}{'-' + block.flag if block.flag else ''}"


# -- the markings ------------------------------------------------------------------------------------------
def test_every_block_says_what_it_is():
    problems = []
    for b in ALL:
        if b.language not in LANGUAGES:
            problems.append(f"{b.where}: info string {b.language!r}: give one of {', '.join(LANGUAGES)}")
        elif b.flag not in ("", "gpu-only", "not-run"):
            problems.append(f"{b.where}: unknown flag {b.flag!r} (gpu-only, or not-run: REASON)")
        elif b.flag == "not-run" and not b.reason:
            problems.append(f"{b.where}: not-run needs a reason (not-run: REASON)")
        elif b.flag and b.language not in ("python", "bash"):
            problems.append(f"{b.where}: {b.language} blocks take no flag")
    assert not problems, "\n".join(problems)
    assert len(ALL) > 30 and any(b.flag == "" and b.language == "python" for b in ALL)


# -- bash: tool commands ------------------------------------------------------------------------------------
def logical_lines(code: str) -> list[str]:
    """Lines with ``\\`` continuations joined, comments and blank lines dropped."""
    out, current = [], ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        text = current.strip()
        current = ""
        if text and not text.startswith("#"):
            out.append(text)
    return out


def tool_command(words: list[str]) -> tuple[str, list[str]] | None:
    """``(module, argv)`` of a tool command (``python scripts/X.py``, ``bcg-X``, also after ``torchrun ...``,
    environment assignments and ``bash -c``), or ``None`` for another command."""
    while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
        words = words[1:]
    if words[:1] == ["torchrun"]:
        words = words[1:]
        while words and words[0].startswith("--"):
            words = words[1:] if "=" in words[0] else words[2:]
        if words and words[0].startswith("scripts/"):  # torchrun runs a script path itself
            words = ["python", *words]
    if len(words) >= 2 and words[0] == "python" and words[1].startswith("scripts/") and words[1].endswith(".py"):
        name = Path(words[1]).stem
        assert name in MODULES, f"scripts/{name}.py is no tool of tests/_scripts.MODULES"
        return MODULES[name], words[2:]
    if words and words[0] in COMMANDS:
        return COMMANDS[words[0]].partition(":")[0], words[1:]
    return None


def commands(code: str) -> list[list[str]]:
    """The commands of a bash block: each logical line split at ``&&`` and ``;``, ``$NAME`` expanded from
    earlier ``NAME=value`` statements of the block, then into words; comments after ``#`` dropped."""
    variables: dict[str, str] = {}
    out = []
    for line in logical_lines(code):
        for part in re.split(r"\s*(?:&&|;)\s*", line):
            if not part:
                continue
            for name, value in re.findall(r"^([A-Za-z_]\w*)=(\S+)$", part):
                variables[name] = value
            expanded = re.sub(r"\$([A-Za-z_]\w*)", lambda m: variables.get(m[1], m[0]), part)
            out.append(shlex.split(expanded, comments=True))
    return [words for words in out if words]


def check_options(module_name: str, argv: list[str], where: str) -> None:
    """The tool's parser accepts ``argv`` (nothing runs)."""
    import importlib

    module = importlib.import_module(module_name)
    parser = module.build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: {module_name} does not take {shlex.join(argv)} (exit {exc.code})")


_ran: dict[tuple, int] = {}


def run_tool(module_name: str, argv: list[str]) -> int:
    import importlib

    key = (module_name, *argv)
    if key not in _ran:
        _ran[key] = importlib.import_module(module_name).main(argv)
    return _ran[key]


@pytest.fixture
def docs_folder(tmp_path, monkeypatch):
    """A fresh working folder with scripts/ linked in, as the docs' commands expect to be run from the
    checkout."""
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    monkeypatch.chdir(tmp_path)
    return tmp_path


BASH = [b for b in ALL if b.language == "bash"]


@pytest.mark.parametrize("block", [b for b in BASH if not b.flag], ids=block_id)
def test_bash_block_runs(block, docs_folder, capsys):
    for words in commands(block.code):
        if words[:2] == ["pip", "install"]:
            continue  # the environment is installed; .ci/run installs the README's command in a fresh one
        if ASSIGNMENTS.match(shlex.join(words)):
            continue
        tool = tool_command(words)
        assert tool is not None, f"{block.where}: {shlex.join(words)!r} is no tool command; mark the block"
        code = run_tool(*tool)
        out = capsys.readouterr()
        assert code == 0, f"{block.where}: {shlex.join(words)} exited {code}\n{out.out[-2000:]}\n{out.err[-2000:]}"


@pytest.mark.parametrize("block", [b for b in BASH if b.flag], ids=block_id)
def test_bash_block_not_run_has_valid_options(block):
    for words in commands(block.code):
        tool = tool_command(words)
        if tool is not None:
            check_options(*tool, block.where)


# -- python ---------------------------------------------------------------------------------------------------
PYTHON = [b for b in ALL if b.language == "python"]


def tiny_pipeline():
    """The docs' "your pipeline" here: tiny Flux on the CPU, defaulting to its tiny size."""
    import bcg_pipelines as pipelines

    pipe = pipelines.build_pipeline("flux", "tiny", device="cpu")
    pipe.default_sample_size = TINY_FLUX_PX // pipe.vae_scale_factor
    return pipe


def with_placeholders(code: str) -> str:
    return "\n".join(PLACEHOLDER.sub(lambda m: f"{m['indent']}{m['name']} = __docs_pipeline__()", line)
                     for line in code.splitlines())


@pytest.mark.parametrize("block", [b for b in PYTHON if not b.flag], ids=block_id)
def test_python_block_runs(block, docs_folder, capsys):
    namespace = {"__name__": "__docs__", "__docs_pipeline__": tiny_pipeline}
    exec(compile(with_placeholders(block.code), block.where, "exec"), namespace)  # noqa: S102 - the docs' code


@pytest.mark.parametrize("block", [b for b in PYTHON if b.flag == "gpu-only"], ids=block_id)
def test_python_block_for_the_gpu_compiles(block):
    compile(block.code, block.where, "exec")


# -- json ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [b for b in ALL if b.language == "json"], ids=block_id)
def test_json_block_parses(block):
    import json

    json.loads(block.code)


def test_the_placeholder_and_the_command_reader():
    assert with_placeholders("pipe = ...   # yours\nx = 1") == "pipe = __docs_pipeline__()\nx = 1"
    assert commands("A=1 B=2 \\\n  python scripts/generate.py --steps 2  # two\nX=a,b; y --k $X && z") == [
        ["A=1", "B=2", "python", "scripts/generate.py", "--steps", "2"], ["X=a,b"], ["y", "--k", "a,b"], ["z"]]
    assert tool_command(["torchrun", "--nproc_per_node", "2", "scripts/generate.py", "--bcg"]) == (
        MODULES["generate"], ["--bcg"])
    assert tool_command(["torchrun", "--nproc_per_node", "2", "run_cp.py"]) is None
    assert tool_command(["bcg-serve", "--port", "0"])[1] == ["--port", "0"]


# -- stderr: a new user's runs print nothing but the project's own notices (issue 39) ----------------------------
#: What may reach stderr on the README's paths: tqdm's progress bars, and the no-GPU notice of ``accelerate_pipeline``
#: (``file:line: RuntimeWarning: ...`` at the caller's line, then that line's source). Anything else (a library's
#: warning, a traceback) fails.
PROGRESS_BAR = re.compile(r"^(?:[\w -]+: *)?\d+%\|")
NO_GPU_NOTICE = re.compile(r"^(?P<file>.+):(?P<line>\d+): RuntimeWarning: bcg-diffusion needs a CUDA GPU; none is "
                           r"available, so the model runs eagerly$")


def unexpected_stderr(err: str) -> tuple[list[str], list[tuple[str, str]]]:
    """``(unexpected lines, [(file, the source line after it)] of each no-GPU notice)`` of a process's stderr."""
    lines = [line for line in re.split(r"[\r\n]+", err) if line.strip()]
    unexpected, notices, i = [], [], 0
    while i < len(lines):
        notice = NO_GPU_NOTICE.match(lines[i])
        if notice:
            follows = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith(" ") else ""
            notices.append((notice["file"], follows.strip()))
            i += 2 if follows else 1
            continue
        if not PROGRESS_BAR.match(lines[i].strip()):
            unexpected.append(lines[i])
        i += 1
    return unexpected, notices


def test_the_stderr_reader():
    err = ("denoising:  11%|█    | 3/28 [00:00<00:01]\r 50%|███  | 1/2\n/tmp/x.py:4: RuntimeWarning: bcg-diffusion "
           "needs a CUDA GPU; none is available, so the model runs eagerly\n  accelerate_pipeline(pipe)\n"
           "Failed to load /x/torchao/_C_mxfp8.so: Could not load this library\n")
    assert unexpected_stderr(err) == (["Failed to load /x/torchao/_C_mxfp8.so: Could not load this library"],
                                      [("/tmp/x.py", "accelerate_pipeline(pipe)")])


def run_quietly(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """A fresh Python process as a new user starts it (no CUDA device: the machine the README's paths assume)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "TORCH_LOGS", "PYTEST_"))}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_main_job_prints_nothing_unexpected_to_stderr(tmp_path):
    done = run_quietly([str(ROOT / "scripts" / "generate.py")], tmp_path)  # the README's first command, as it is
    unexpected, notices = unexpected_stderr(done.stderr)
    assert not unexpected and not notices, "\n".join(unexpected)
    assert (tmp_path / "outputs" / "flux_tiny_seed0.png").is_file()


README_SECTION = "README.md (as written, run first)"
DRIVER = """
import runpy, sys
print("=== {readme_section}", file=sys.stderr, flush=True)
print("=== {readme_section}", flush=True)
runpy.run_path({readme!r}, run_name="__main__")  # first: the README example meets a fresh process
sys.stderr.flush()
print("=== the docs blocks", flush=True)
sys.path[:0] = [{tools!r}, {tests!r}]
from test_docs_snippets import PYTHON, tiny_pipeline, with_placeholders
for block in [b for b in PYTHON if not b.flag and b.page.name != "README.md"]:
    print("=== " + block.where, file=sys.stderr, flush=True)
    exec(compile(with_placeholders(block.code), block.where, "exec"),
         {{"__name__": "__docs__", "__docs_pipeline__": tiny_pipeline}})
    sys.stderr.flush()
"""


def test_the_readme_example_and_the_docs_python_examples_run_quietly(tmp_path):
    """One fresh process (each costs seconds of imports): first the README's Python example as written, from
    a file, as a new user runs it (``runpy`` before anything else is imported), then every other docs block
    that runs. Nothing unexpected on stderr; the no-GPU notice points at the README's own line."""
    readme = [b for b in PYTHON if b.page.name == "README.md" and not b.flag]
    assert len(readme) == 1 and "= ..." not in readme[0].code, "the README example runs as written (no placeholder)"
    script = tmp_path / "example.py"
    script.write_text(readme[0].code)
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    done = run_quietly(["-c", DRIVER.format(readme_section=README_SECTION, readme=str(script),
                                            tools=str(ROOT / "tests" / "tools"), tests=str(ROOT / "tests"))], tmp_path)
    sections = re.split(r"^=== (.+)\n", done.stderr, flags=re.M)
    assert not sections[0].strip(), sections[0]  # nothing before the first block
    assert sections[1] == README_SECTION, sections[1]
    unexpected, notices = unexpected_stderr(sections[2])
    assert not unexpected, "\n".join(unexpected)
    assert notices == [(str(script), "accelerate_pipeline(pipe)       # every denoising step now replays captured "
                                     "graph segments")], sections[2]  # at the user's line
    readme_stdout = done.stdout.split("=== ")[1]
    assert readme_stdout.startswith(README_SECTION) and "not accelerated" in readme_stdout, done.stdout
    where = {b.where for b in PYTHON if not b.flag and b.page.name != "README.md"}
    problems = []
    for block, err in zip(sections[3::2], sections[4::2]):
        unexpected, notices = unexpected_stderr(err)
        problems += [f"{block}: {line}" for line in unexpected]
        problems += [f"{block}: the no-GPU notice points at {file}, not at a docs block" for file, _ in notices
                     if file not in where]
    assert set(sections[3::2]) == where
    assert not problems, "\n".join(problems)
