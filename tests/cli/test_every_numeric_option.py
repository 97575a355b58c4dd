"""Every option of `run`, `bench`, `capture` and `import` that takes a number or a text, driven
with 0, -1, nan, inf, 1e308, Unicode digits and a huge integer: the exit status is 0, 2 or 3,
never a traceback, and with 2 not a byte of the target or the output is written. The cases come
from the commands' own parameters (int, float and str options), so an option added later is
tried without a line here. Recipes' knobs are not driven: a value they accept sets up and
captures a real application."""
import hashlib
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import typer

from replay.cli import app
from tests.cli_process import replay_cli
from traces.schema import Op
from traces.trace import write_trace

VALUES = ("0", "-1", "nan", "inf", "1e308", "５", str(2**64))
COMMANDS = ("run", "bench", "capture device", "import")
MIB = 1 << 20
# The trace's I/Os and the bench's span stay inside this much of the target.
TARGET_BYTES = 4 * MIB
# A bench test for the options that name none ("act: ...", "mix, seqmix: ..." name theirs).
BENCH_TESTS = ("mix", "seqmix", "steady", "act", "pts")


def _base_type(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return _base_type(args[0]) if typing.get_origin(annotation) is typing.Union else annotation


def _options():
    """(command path, option, help) of every int, float and str option of COMMANDS."""
    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), command

    for path, command in walk(typer.main.get_command(app), ()):
        if path not in COMMANDS:
            continue
        for p in command.params:
            if p.param_type_name == "option" and not p.is_flag and \
                    _base_type(p.type_descriptor.annotation) in (int, float, str):
                yield path, p.opts[0], p.help or ""


OPTIONS = sorted(set(_options()))
CASES = [pytest.param(path, option, help_, id=f"{path}{option}",
                      marks=[pytest.mark.root, pytest.mark.loopdev] if path.startswith("capture") else [])
         for path, option, help_ in OPTIONS]


def test_the_cases_cover_the_options_the_issue_names():
    named = {("bench", o) for o in ("--multiple", "--start", "--step", "--duration", "--point", "--period",
                                     "--precondition", "--round", "--scale", "--window", "--seed")}
    named |= {("run", "--speed"), ("run", "--think-scale"), ("run", "--qd"), ("run", "--data"),
              ("capture device", "--duration"), ("import", "--jobs")}
    assert named <= {(path, option) for path, option, _ in OPTIONS}


def test_the_docs_say_how_many_cases_there_are():
    page = (Path(__file__).resolve().parents[2] / "docs" / "replaying.md").read_text()
    said = " ".join(page.split())
    assert f"({len(OPTIONS)} options," in said and f"{len(OPTIONS) * len(VALUES)} cases" in said


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny trace of reads and writes inside TARGET_BYTES, and an MSR CSV of the same."""
    d = tmp_path_factory.mktemp("inputs")
    n = 64
    i = np.arange(n, dtype=np.int64)
    write_trace(d / "tiny.parquet", {
        "ts_ns": i * 10_000, "op": np.where(i % 2 == 0, Op.WRITE, Op.READ).astype(np.uint8),
        "offset": (i * 7 % 64) * 4096, "length": np.full(n, 4096, np.int64)},
        {"name": "tiny", "device_size": TARGET_BYTES})
    (d / "vol.csv").write_text("".join(
        f"{128166372003061629 + 100 * k},hm,0,{'Write' if k % 2 else 'Read'},{k * 4096},4096,{k}\n"
        for k in range(n)))
    return d


def _bench_test(option, help_):
    """The test an option belongs to, by its help ("act --search: ..." belongs to act)."""
    named = help_.split(":", 1)[0].replace(",", " ").split()
    test = next((t for t in named if t in BENCH_TESTS), "mix")
    return [test, "--search"] if "--search" in named else [test]


def _args(path, option, value, help_, files, tmp_path, target):
    """The command line of one case: the option at `value` on a quick run of its command, the
    other options at values that keep the run short."""
    out = tmp_path / "out"
    given = {option: value}
    if path != "bench":  # bench makes its -o directory; the others write into one
        out.mkdir(exist_ok=True)
    if path == "run":
        return ["run", files / "tiny.parquet", target, "-o", out / "r.parquet",
                *_pairs(given, {"--engine": "psync"})]
    if path == "bench":
        return ["bench", *_bench_test(option, help_), target, "-o", out,
                *_pairs(given, {"--engine": "psync", "--span": "1M", "--fill": "1M", "--scale": "0.0002",
                                "--block-sizes": "4K", "--max-rounds": "5", "--read-shares": "70",
                                "--qd": "1x3", "--no-prep": None})]
    if path == "import":
        # -o DIR: the many-files import, where --jobs applies.
        return ["import", files / "vol.csv", "--format", "msr", "-o", out, *_pairs(given, {})]
    if path == "capture device":
        return ["capture", target, "-o", out / "c.parquet", *_pairs(given, {"--duration": "0.2"})]
    raise AssertionError(f"no command line for {path}: add one")


def _pairs(given, defaults):
    args = []
    for option, value in {**defaults, **given}.items():
        args += [option] if value is None else [option, value]
    return args


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@pytest.mark.parametrize("path, option, help_", CASES)
def test_edge_values_exit_0_2_or_3_without_a_traceback(path, option, help_, files, tmp_path, loop_device):
    # The values run two at a time, each in its own directory with its own target: a file for
    # run and bench (its bytes are compared), a block device for capture.
    cases = []
    for k, value in enumerate(VALUES):
        (tmp_path / str(k)).mkdir()
        cases.append((value, tmp_path / str(k),
                      loop_device(TARGET_BYTES) if path == "capture device" else None))
    with ThreadPoolExecutor(2) as pool:
        failures = [f for f in pool.map(lambda c: _one(path, option, help_, files, *c), cases) if f]
    assert not failures, "\n\n".join(failures)


def _one(path, option, help_, files, value, tmp_path, device) -> str | None:
    """What is wrong with `option` at `value` (None: nothing)."""
    target = device or tmp_path / "target.img"
    if device is None:
        target.write_bytes(b"\x5a" * TARGET_BYTES)
    before = _digest(target) if device is None else None
    done = replay_cli(*_args(path, option, value, help_, files, tmp_path, target), cwd=tmp_path,
                      timeout=120)
    said = f"{option} {value}: exit {done.returncode}: {done.stderr[-1500:]}"
    if "Traceback" in done.stderr or done.returncode not in (0, 2, 3):
        return said
    if done.returncode == 2:
        if not done.stderr.strip():
            return said + "(exit 2 without a word)"
        if before is not None and _digest(target) != before:
            return said + "(a refused command wrote to its target)"
        out = tmp_path / "out"
        if out.exists() and any(p.is_file() for p in out.rglob("*")):
            return said + f"(a refused command left {sorted(out.rglob('*'))})"
    return None
