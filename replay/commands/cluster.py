"""`replay run TRACE --cluster ADDRESS --plan PLAN`: one replay on several hosts of a Ray
cluster (replay.multihost), its summary per host and for the whole."""
import json
from datetime import datetime
from pathlib import Path

import typer

from replay.commands import fail
from traces.errors import ReplayError


def run_on_cluster(trace, target, options, plan, cluster, output, json_out):
    if plan is None or not cluster:
        fail(ReplayError("a replay on a cluster needs both --cluster ADDRESS and --plan PLAN"))
    if target is not None:
        fail(ReplayError("with --plan the targets are the plan's (one per host); leave TARGET out"))
    if options.dry_run:
        fail(ReplayError("--dry-run is not available with --plan: every host checks its target before any starts"))
    from replay.multihost import CLUSTER_FILE, RUN_FILE, run_cluster

    output = output or Path(f"{Path(trace).stem}-cluster-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    try:
        record = run_cluster(trace, plan, cluster, options, output, echo=lambda m: typer.echo(m, err=True))
    except ReplayError as e:
        fail(e)
    if json_out:
        typer.echo(json.dumps(record, indent=2, default=str))
    else:
        typer.echo(_table(record))
        typer.echo(f"results: {output}/ ({RUN_FILE}: the whole run; hosts/: one file per host; "
                   f"{CLUSTER_FILE}: clocks, skew, hosts)")
    if record["failed_hosts"]:
        typer.echo(f"partial: {', '.join(record['failed_hosts'])} failed; the other hosts' results are "
                   f"kept in {output}, marked partial", err=True)
        raise typer.Exit(130 if record["interrupted"] else 1)
    if record["interrupted"]:
        typer.echo(f"interrupted: every host stopped; the I/Os done are kept in {output}, marked "
                   "interrupted", err=True)
        raise typer.Exit(130)


def _iops_mbs(summary: dict | None) -> str:
    if not summary:
        return "-"
    jobs = summary.get("jobs") or [{}]
    job = jobs[0]
    parts = []
    for op in ("read", "write"):
        s = job.get(op) or {}
        if s.get("total_ios"):
            parts.append(f"{op} {s.get('iops', 0):,.0f} IOPS {s.get('bw_bytes', 0) / 1e6:,.1f} MB/s")
    return ", ".join(parts) or "no reads or writes"


def _table(record: dict) -> str:
    lines = [f"{'host':<12} {'node':<16} {'I/Os':>10} {'of':>10} {'offset':>10} {'rtt':>8}  state / result"]
    for h in record["hosts"]:
        state = h["error"] or ("interrupted" if h["interrupted"] else _iops_mbs(h["summary"]))
        offset = "-" if h["offset_ns"] is None else f"{h['offset_ns'] / 1e3:+.0f}us"
        rtt = "-" if h["rtt_ns"] is None else f"{h['rtt_ns'] / 1e3:.0f}us"
        node = str((h.get("node") or {}).get("ip", "-"))
        lines.append(f"{h['name']:<12} {node:<16} {h['rows']:>10,} {h['rows_planned']:>10,} {offset:>10} {rtt:>8}  {state}")
    total = sum(h["rows"] for h in record["hosts"])
    planned = sum(h["rows_planned"] for h in record["hosts"])
    lines.append(f"{'whole':<12} {'':<16} {total:>10,} {planned:>10,} {'':>10} {'':>8}  {_iops_mbs(record.get('summary'))}")
    lines.append(f"start skew {record['start_skew_ns'] / 1e3:.0f} us (clock offsets known to "
                 f"+-{record['offset_uncertainty_ns'] / 1e3:.0f} us)"
                 + ("; partial" if record["partial"] else ""))
    return "\n".join(lines)
