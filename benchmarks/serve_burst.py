"""A burst against `venus-gym serve-retrieval`: keep-alive clients that all connect at once,
a tenth of their requests malformed, then clients that leave before their reply.

    python benchmarks/serve_burst.py [--clients 32] [--requests 2000] [--backlog N]

The server is the real command (`python -m trainers.cli serve-retrieval --port 0`, a
2,000-page synthetic world) in its own process; every client is a thread with one
HTTP/1.1 keep-alive connection, released together by a barrier so their connects arrive
at once. `--backlog 5` is the standard library's default listen backlog, for comparison.

Prints:
    RESULT good_requests=<int>        well-formed requests sent
    RESULT good_errors=<int>          of those, answered with anything but HTTP 200 or not
                                      answered (a reset connection, a timeout)
    RESULT bad_requests=<int>         malformed requests sent ({"queries": 5})
    RESULT bad_not_400=<int>          of those, answered with anything but HTTP 400
    RESULT early_disconnects=<int>    clients that left before their reply was written
    RESULT disconnect_log_lines=<int> one-line "went away" messages in the server's stderr
    RESULT tracebacks=<int>           tracebacks in the server's stderr
    RESULT requests_per_s=<float>     all burst requests / the burst's wall time
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_server(backlog: int | None, log: object) -> tuple[subprocess.Popen, int]:
    command = [sys.executable, "-m", "trainers.cli", "serve-retrieval", "--port", "0",
               "--world", "synthetic", "--world-size", "2000"]
    if backlog is not None:
        command += ["--backlog", str(backlog)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    line = proc.stdout.readline().strip()  # "serving http://127.0.0.1:PORT/retrieve"
    if not line.startswith("serving "):
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1].split("/")[0])


def burst(port: int, clients: int, total: int) -> dict[str, int | float]:
    counts = {"good_requests": 0, "good_errors": 0, "bad_requests": 0, "bad_not_400": 0}
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    shares = [total // clients + (i < total % clients) for i in range(clients)]
    offsets = [sum(shares[:i]) for i in range(clients)]

    def client(index: int) -> None:
        start.wait()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(shares[index]):
            bad = (offsets[index] + i) % 10 == 0  # every tenth request of the burst
            body = b'{"queries": 5}' if bad else json.dumps(
                {"queries": [f"river {index} town {i}"], "topk": 3}).encode()
            status = None
            try:
                conn.request("POST", "/retrieve", body=body,
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            with lock:
                if bad:
                    counts["bad_requests"] += 1
                    counts["bad_not_400"] += status != 400
                else:
                    counts["good_requests"] += 1
                    counts["good_errors"] += status != 200
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {**counts, "requests_per_s": total / seconds}


def early_disconnects(port: int, count: int) -> int:
    """Clients that send a request with a large reply and close at once."""
    body = json.dumps({"queries": ["river town"] * 200, "topk": 20}).encode()
    head = (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head + body)
    return count


def wait_for_lines(log: object, text: str, count: int, seconds: float) -> str:
    """The log once it has `count` lines holding `text` (the server answers the clients
    that left in its own time), or after `seconds`."""
    ends = time.monotonic() + seconds
    while True:
        log.seek(0)
        content = log.read()
        if content.count(text) >= count or time.monotonic() > ends:
            return content
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2000, help="burst requests in all")
    parser.add_argument("--disconnects", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=None,
                        help="the server's --backlog (default: the server's own default)")
    args = parser.parse_args()
    with tempfile.TemporaryFile("w+") as log:
        proc, port = start_server(args.backlog, log)
        try:
            results = burst(port, args.clients, args.requests)
            results["early_disconnects"] = early_disconnects(port, args.disconnects)
            stderr = wait_for_lines(log, "went away", args.disconnects, seconds=60)
        finally:
            proc.terminate()
            proc.wait(30)
        log.seek(0)
        stderr = log.read()
    results["disconnect_log_lines"] = sum("went away" in line for line in stderr.splitlines())
    results["tracebacks"] = stderr.count("Traceback")
    for key in ("good_requests", "good_errors", "bad_requests", "bad_not_400",
                "early_disconnects", "disconnect_log_lines", "tracebacks"):
        print(f"RESULT {key}={results[key]}")
    print(f"RESULT requests_per_s={results['requests_per_s']:.0f}")


if __name__ == "__main__":
    main()
