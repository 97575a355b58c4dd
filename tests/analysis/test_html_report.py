"""`replay report`: a self-contained HTML page whose plots decode and are not blank, rendered in
headless Chromium without console errors; results sets, partial runs and bad input."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np
import pyarrow.parquet as pq
import pytest

from tests import cli_process
from analysis import plots
from analysis.verdict import SYNTHETIC_SCORES
from replay.runner import RunOptions, replay
from synth.generators import random_mix, to_trace
from traces.schema import METADATA_KEY

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
FIGURES = {"latency_cdf", "iops_over_time", "latency_over_time", "latency_scatter", "inflight"}


def replay_cli(*args):
    return cli_process.replay_cli(*args, cwd=REPO, timeout=180)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Null-engine results on two 'targets' (QD1 and QD32), a synthetic mix and a timed
    workload each, plus a mix and a steady results set for each side."""
    d = tmp_path_factory.mktemp("report")
    mix = to_trace(random_mix(block_size=4096, read_share=0.7, span=32 * MIB, span_start=0,
                              count=3000, queue_depth=32, seed=1), d / "mix.parquet")
    work = to_trace(random_mix(block_size=8192, read_share=0.5, span=32 * MIB, span_start=0,
                               count=2000, rate=20000, queue_depth=32, seed=2), d / "work.parquet",
                    metadata={"name": "oltp"})
    out = {}
    for side, qd in (("a", 1), ("b", 32)):
        files = []
        for trace, name in ((mix, "mix"), (work, "oltp")):
            path = d / f"{side}-{name}.parquet"
            replay(trace, None, RunOptions(engine="null", timing="afap", qd=qd), output=path)
            files.append(path)
        sets = []
        for test, scores in (("mix", {"iops_70_30_32x1": 1000.0 * qd, "table": [
                {"read_share": s, "qd": q, "workers": 1, "iops": 100.0 * qd * q * (1 + s), "mb_per_s": 1.0, "p99_ns": 1}
                for q in (1, 32) for s in (0.0, 0.4, 0.7, 1.0)]}),  # a split's sweep at a time, as mix runs
                             ("steady", {"steady_iops": 900.0 * qd, "steady_state": {"reached": True, "round": 3, "rounds": [
                                 {"iops": 1000.0 * qd * r} for r in (1.5, 1.2, 1.0, 1.0, 1.0)]},
                                 "iops_series": list(np.linspace(2, 1, 60) * 1000 * qd)})):
            sd = d / f"{side}-{test}"
            sd.mkdir()
            shutil.copy(files[0], sd / "r70-qd32.parquet")
            (sd / "results.json").write_text(json.dumps({
                "format": "tracereplay-results-set", "version": 1, "test": test, "target": {"path": side},
                "interrupted": False, "options": {}, "scores": scores,
                "runs": [{"name": "r70-qd32", "file": "r70-qd32.parquet", "role": "measure", "parameters": {}}]}))
            sets.append(sd)
        out[side] = (files, sets)
    out["dir"] = d
    return out


def _report(runs, tmp_path, *extra):
    (fa, sa), (fb, sb) = runs["a"], runs["b"]
    inputs = [*fa, *sa, *fb, *sb]
    labels = [x for side, n in (("slow", len(fa) + len(sa)), ("fast", len(fb) + len(sb))) for x in ["--label", side] * n]
    out = tmp_path / "report.html"
    done = replay_cli("report", *inputs, *labels, "-o", out, *extra)
    assert done.returncode == 0, done.stderr
    return out


def _nonblank_png(path):
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    return float(img[..., :3].std())


def test_report_is_self_contained_with_every_plot(runs, tmp_path):
    out = _report(runs, tmp_path)
    page = out.read_text()
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", page), "the page must need no network"
    names = {p.stem for p in (tmp_path / "report_files").glob("*.png")}
    assert names >= FIGURES | {"mix_sweep", "steady_rounds", "steady_iops", "heatmap_oltp", "heatmap_random"}
    for name in names:
        assert f"id='{name}'" in page and f"report_files/{name}.png" in page
        assert _nonblank_png(tmp_path / "report_files" / f"{name}.png") > 0.01
    assert page.count("data:image/png;base64,") == len(names)
    assert "Verdict: does the synthetic advantage show up" in page and "fast is" in page
    assert "<td>slow</td><td>oltp</td>" in page and "<td>fast</td><td>mix</td>" in page
    assert "(partial)" not in page


def test_interrupted_results_are_shown_marked_partial(runs, tmp_path):
    src = runs["a"][0][1]
    table = pq.read_table(src)
    doc = json.loads(table.schema.metadata[METADATA_KEY])
    doc["interrupted"] = True
    pq.write_table(table.slice(0, 500).replace_schema_metadata({METADATA_KEY: json.dumps(doc).encode()}),
                   tmp_path / "cut.parquet")
    done = replay_cli("report", tmp_path / "cut.parquet", runs["b"][0][1], "-o", tmp_path / "r.html")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    assert page.count("partial (interrupted)") == 1 and "interrupted runs" in page
    assert "<td>500</td>" in page  # the 500 I/Os it did


def test_synthetic_scores_and_the_verdict_read_as_words_in_html_tables(runs, tmp_path):
    page = _report(runs, tmp_path).read_text()
    key, label, unit = SYNTHETIC_SCORES["mix"]
    # The fixture's scores: 1,000 x QD for the mix, 900 x QD steady-state IOPS (QD 1 and 32).
    assert f"{label}: 1,000 {unit}" in page and f"{label}: 32,000 {unit}" in page
    assert "steady state: 28,800 IOPS" in page and "SNIA steady state reached at round 3" in page
    assert key not in page and not re.search(r"\d\.\d+e[+-]\d", page), "raw keys or scientific notation"
    verdict_part = page.split("<h2>Verdict", 1)[1].split("<h2>Plots", 1)[0]
    assert "<pre>" not in verdict_part and verdict_part.count("<table") == 2
    assert f"<td>{label}</td><td>1,000 {unit}</td><td>32,000 {unit}</td><td>32.00x</td>" in verdict_part
    for name in ("random", "oltp"):  # a row per workload, its answer, and its sentence
        row = re.search(rf"<tr><td>{name}</td><td>afap</td>(.*?)</tr>", verdict_part)
        assert row and re.search(r"<b>(yes|partly|no|reversed)</b>", row.group(1)), name
        assert re.search(rf"<li>fast is 32.00x faster than slow on [^<]*; on {name} it finishes", verdict_part)


def test_latency_cdf_is_one_panel_per_trace_with_a_line_per_target_and_op():
    lat, share = np.array([10_000, 20_000, 400_000]), np.array([0.5, 0.9, 1.0])
    targets = [f"drive {i}" for i in range(4)]
    panels = {trace: {t: {"read": (lat * (i + 1), share), "write": (lat * (i + 2), share)}
                      for i, t in enumerate(targets)} for trace in ("oltp", "blob", "boot")}
    fig = plots.latency_cdf(panels)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["oltp", "blob", "boot"]
    for ax in shown:
        lines = ax.get_lines()
        assert len(lines) == 8  # 4 targets x 2 ops, not 24 in one panel
        assert [ln.get_linestyle() for ln in lines] == ["-", "--"] * 4
    colours = [[ln.get_color() for ln in ax.get_lines()] for ax in shown]
    assert colours[0] == colours[1] == colours[2] and len(set(map(str, colours[0]))) == 4
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [*targets, "read", "write"]
    plots.png_bytes(fig)


@pytest.mark.parametrize("case, phrase", [("missing", "no such file"), ("trace", "not the results of a replay"),
                                           ("labels", "one --label per input"), ("window", "--window-ms")])
def test_bad_input_is_one_sentence_and_no_page(runs, tmp_path, case, phrase):
    args = {"missing": [tmp_path / "nope.parquet"], "trace": [runs["dir"] / "mix.parquet"],
            "labels": [runs["a"][0][0], "--label", "x", "--label", "y"],
            "window": [runs["a"][0][0], "--window-ms", "0"]}[case]
    done = replay_cli("report", *args, "-o", tmp_path / "r.html")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and phrase in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


_CHECK = ("<script>window.addEventListener('load',()=>{const im=[...document.images];"
          "const r=im[0].getBoundingClientRect();"
          "document.title='decoded '+im.filter(i=>i.complete&&i.naturalWidth>0).length+' of '+im.length"
          "+' first at '+[r.left+im[0].clientLeft+scrollX,r.top+im[0].clientTop+scrollY,"
          "im[0].clientWidth,im[0].clientHeight,im[0].naturalWidth].map(Math.round).join(',');});"
          "</script></body>")
WINDOW = "--window-size=1200,2400"


def _chromium(*args, timeout=90):
    exe = shutil.which("chromium")
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (Debian package chromium)")
def test_report_renders_in_headless_chromium(runs, tmp_path):
    out = _report(runs, tmp_path)
    images = out.read_text().count("<img ")
    probe = tmp_path / "probe.html"  # the report plus a script that counts decoded images
    probe.write_text(out.read_text().replace("</body>", _CHECK))
    dom = _chromium("--dump-dom", WINDOW, probe.as_uri())
    found = re.search(rf"<title>decoded {images} of {images} first at (\d+),(\d+),(\d+),(\d+),(\d+)</title>",
                      dom.stdout)
    assert found, dom.stdout[:300]
    left, top, width, height, natural = map(int, found.groups())
    assert width == natural, "the first plot is shown at its own size, not scaled"
    assert ":CONSOLE" not in dom.stderr, "the page logged to the console"
    shot = tmp_path / "shot.png"
    done = _chromium(f"--screenshot={shot}", WINDOW, out.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    img = matplotlib.image.imread(shot)[..., :3]
    assert img.shape[:2] == (2400, 1200) and top + height <= 2400
    # The screenshot shows the first plot (the latency CDF) pixel for pixel as its PNG file has
    # it: compared where the page laid it out, give or take a pixel of rounding.
    png = matplotlib.image.imread(tmp_path / "report_files" / "latency_cdf.png")[..., :3]
    assert png.shape[:2] == (height, width)
    diff = min(float(np.abs(img[top + dy:top + dy + height, left + dx:left + dx + width] - png).mean())
               for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    assert diff < 0.01, f"the screenshot differs from the plot by {diff:.3f} on average"
    # The console check can fail: the same call sees an error logged by a page.
    bad = tmp_path / "bad.html"
    bad.write_text("<script>console.error('broken')</script>")
    assert ":CONSOLE" in _chromium("--dump-dom", bad.as_uri()).stderr


def test_a_causal_replay_is_labelled_causal_not_timed(runs, tmp_path):
    src = runs["a"][0][1]
    table = pq.read_table(src)
    doc = json.loads(table.schema.metadata[METADATA_KEY])
    doc["run"].update(mode="causal", think_scale=0.5)
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(doc).encode()}), tmp_path / "c.parquet")
    done = replay_cli("report", tmp_path / "c.parquet", src, "-o", tmp_path / "r.html")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "<td>causal, think x0.5</td>" in page and "timed x1" not in page
    assert "<td>afap QD1</td>" in page


def test_a_colour_means_one_target_in_every_plot(runs):
    """Two targets, two traces each: the CDF, the IOPS dots, latency over time (p50 and p99),
    the scatter and the I/Os in flight give each target one colour, never the other's."""
    from analysis import report
    from analysis.results import load

    files = [report._Item(p, side, load(p)) for side, key in (("slow", "a"), ("fast", "b"))
             for p in runs[key][0]]
    colours = plots.target_colours(["slow", "fast"])
    figures = dict((name, fig) for name, _, fig in report._file_figures(files, 10**8, colours))
    seen = {"slow": set(), "fast": set()}

    def note(label, colour):
        target = label.split(":")[0].split()[0]
        seen[target].add(matplotlib.colors.to_hex(colour))

    for handle in figures["latency_cdf"].legends[0].legend_handles[:2]:
        note(handle.get_label(), handle.get_color())
    for name in ("latency_over_time", "inflight"):
        for line in figures[name].axes[0].get_lines():
            note(line.get_label(), line.get_color())
    for name in ("iops_over_time", "latency_scatter"):
        for dots in figures[name].axes[0].collections:
            note(dots.get_label(), dots.get_facecolor()[0])
    assert seen == {t: {matplotlib.colors.to_hex(colours[t])} for t in seen}
    lines = figures["latency_over_time"].axes[0].get_lines()
    assert len(lines) == 8 and len({(ln.get_color(), ln.get_linestyle(), ln.get_linewidth()) for ln in lines}) == 8
    for fig in figures.values():
        plots.png_bytes(fig)
