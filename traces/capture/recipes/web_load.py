"""The web recipe's load generator: a few client threads, each on one keep-alive HTTP/1.1
connection to 127.0.0.1, fetching a fixed list of URL paths between them; prints its own
figures (requests, bytes, errors, latency) as one JSON line.

    python -m traces.capture.recipes.web_load URLS.txt --port 8080 --clients 8

Python's http.client, not wrk or ab: wrk sleeps its whole --duration even when its script
stops every thread (so it cannot do fixed work), and ab fetches a single URL per run.
"""
import argparse
import http.client
import json
import sys
import threading
import time


def fetch(paths: list[str], port: int, figures: dict, lock: threading.Lock) -> None:
    """GET each of `paths` in turn on one connection (reopened after an error)."""
    done = nbytes = errors = 0
    latencies = []
    conn = None
    for path in paths:
        start = time.monotonic_ns()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            nbytes += len(body)
            errors += response.status != 200
        except (OSError, http.client.HTTPException):
            errors += 1
            if conn is not None:
                conn.close()
            conn = None
        done += 1
        latencies.append(time.monotonic_ns() - start)
    if conn is not None:
        conn.close()
    with lock:
        figures["requests"] += done
        figures["bytes"] += nbytes
        figures["errors"] += errors
        figures["latencies"].extend(latencies)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", help="file of URL paths, one a line, fetched in this order")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)
    with open(args.urls) as f:
        paths = f.read().split()
    figures = {"requests": 0, "bytes": 0, "errors": 0, "latencies": []}
    lock = threading.Lock()
    # Client i takes requests i, i + clients, ...: the list's order is kept across clients.
    threads = [threading.Thread(target=fetch, args=(paths[i::args.clients], args.port, figures, lock))
               for i in range(args.clients)]
    start = time.monotonic_ns()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = (time.monotonic_ns() - start) / 1e9
    latencies = sorted(figures.pop("latencies"))
    if latencies:
        figures["latency_ms"] = {"avg": sum(latencies) / len(latencies) / 1e6,
                                 "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] / 1e6,
                                 "max": latencies[-1] / 1e6}
    figures["requests_per_s"] = figures["requests"] / elapsed if elapsed else None
    print(json.dumps(figures))
    return 1 if figures["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
