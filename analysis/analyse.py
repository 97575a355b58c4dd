"""One streaming pass over a results file for its run summary, time series and fidelity: the
file is read and decoded once, by a thread that decodes the next row group while the previous
one is analysed, and fidelity's kernels run on a second thread beside the other two's.
"""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from analysis.fidelity import LATENCY, Fidelity, FidelityBuilder
from analysis.fidelity import _COLUMNS as _FIDELITY_COLUMNS
from analysis.summary import _COLUMNS as _SUMMARY_COLUMNS
from analysis.summary import RunSummary
from analysis.timeseries import _COLUMNS as _SERIES_COLUMNS
from analysis.timeseries import SECOND_NS, SeriesBuilder, TimeSeries

# Rows per chunk and chunks decoded ahead. Over 10M rows, 2**20 rows and two ahead peaked at
# 865 MB RSS (Parquet decoding buffers and each analysis' temporaries scale with the chunk),
# 2**19 rows and one ahead at 510 MB, for the same CPU time.
ROWS = 1 << 19
AHEAD = 1


@dataclass
class Analysis:
    """What `analyse` computed; an analysis not asked for is None."""

    summary: RunSummary | None
    series: TimeSeries | None
    fidelity: Fidelity | None


def analyse(results, bin_ns=SECOND_NS, *, summary=True, series=True, fidelity=True,
            rows=ROWS) -> Analysis:
    """The run summary, the time series in windows of `bin_ns` and the fidelity of one replay
    (an analysis.results.Results), from one read of its file, in memory bounded by a few
    chunks of `rows` rows whatever the file's length. The summary is also cached on `results`
    (`results.summary` then costs nothing). Raises what Results.chunks and the builders raise.
    """
    columns = []
    for wanted, names in ((summary, _SUMMARY_COLUMNS), (series, _SERIES_COLUMNS),
                          (fidelity, _FIDELITY_COLUMNS)):
        if wanted:
            columns += [n for n in names if n not in columns]
    with_latency = bool(fidelity) and results.has(LATENCY)
    if with_latency:
        columns.append(LATENCY)
    run_summary = RunSummary(jobname=results.name or "tracereplay") if summary else None
    series_builder = SeriesBuilder(bin_ns) if series else None
    fidelity_builder = FidelityBuilder(
        speed=results.speed, mode=results.run.get("mode", "original"), with_latency=with_latency,
    ) if fidelity else None
    if columns:
        local = [b.add for b in (run_summary, series_builder) if b is not None]
        # Fidelity costs about as much as the other two together (CPU s over 10M rows: 1.2
        # against 0.3 + 0.3, reading 0.8), so it gets its own thread; its add only reads
        # the chunk, which the others share.
        with ThreadPoolExecutor(1, thread_name_prefix="fidelity") as pool:
            pending = None
            for chunk in results.chunks(columns, rows=rows, ahead=AHEAD):
                if pending is not None:
                    pending.result()
                    pending = None
                if fidelity_builder is not None:
                    pending = pool.submit(fidelity_builder.add, chunk)
                for add in local:
                    add(chunk)
            if pending is not None:
                pending.result()
    if run_summary is not None:
        results.cache_summary(run_summary)
    return Analysis(
        summary=run_summary,
        series=series_builder.finish() if series_builder is not None else None,
        fidelity=fidelity_builder.finish() if fidelity_builder is not None else None,
    )
