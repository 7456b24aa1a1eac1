#!/usr/bin/env python3
"""CPU time and wake-ups of a process, thread by thread, from /proc (robust to machine load:
it counts the process's own CPU time and context switches, not wall-clock time).

    threads.py PID SECONDS            one window: a table of CPU and wake-ups per thread
    threads.py --wrap OUT.jsonl -- CMD ARGS...
                                      execs CMD in this process (same PID, so whoever started
                                      it still measures and signals it) and samples its threads
                                      every --every seconds into OUT.jsonl from a forked child
    threads.py --report OUT.jsonl FROM TO
                                      the table for the window [FROM, TO] seconds after the
                                      first sample (e.g. the benchmark's measured window)

Per thread: CPU from se.sum_exec_runtime (ns precision, /proc/PID/task/TID/sched) and
wake-ups as voluntary context switches (each one is a sleep that something had to end).
Thread names are librdkafka's (rdk:main, rdk:broker1, ...), tokio's and the relay's own.
"""
import json
import os
import re
import sys
import time


def read_threads(pid):
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/sched") as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        run = float(re.search(r"se\.sum_exec_runtime\s*:\s*([\d.]+)", text).group(1))  # ms
        vol = int(re.search(r"nr_voluntary_switches\s*:\s*(\d+)", text).group(1))
        out[tid] = (comm, run, vol)
    return out


def table(a, b, seconds):
    """Rows per thread name (threads of the same name summed), from snapshot a to b."""
    rows = {}
    for tid, (comm, run, vol) in b.items():
        run0, vol0 = (a[tid][1], a[tid][2]) if tid in a else (0.0, 0)
        name = re.sub(r"\d+$", "#", comm) if comm.startswith("rdk:broker") else comm
        r = rows.setdefault(name, [0, 0.0, 0])
        r[0] += 1
        r[1] += run - run0
        r[2] += vol - vol0
    total_ms = sum(r[1] for r in rows.values())
    total_w = sum(r[2] for r in rows.values())
    lines = [f"window {seconds:.1f} s; process CPU {total_ms:.2f} ms = {100 * total_ms / 1000 / seconds:.3f} % of a core; "
             f"{total_w / seconds:.1f} wake-ups/s",
             f"{'thread':<28}{'n':>3}{'CPU ms':>10}{'ms/s':>9}{'wake/s':>9}"]
    for name, (n, ms, w) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{name:<28}{n:>3}{ms:>10.2f}{ms / seconds:>9.3f}{w / seconds:>9.1f}")
    return "\n".join(lines), total_ms, total_w


def main():
    args = sys.argv[1:]
    if args and args[0] == "--wrap":
        out = args[1]
        every = 1.0
        rest = args[2:]
        if rest and rest[0] == "--every":
            every = float(rest[1])
            rest = rest[2:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        pid = os.getpid()
        if os.fork() == 0:
            # The sampler: until the exec'd command is gone.
            with open(out, "w") as f:
                start = time.monotonic()
                while True:
                    snap = read_threads(pid)
                    if snap is None or os.getppid() != pid:
                        break
                    f.write(json.dumps({"t": time.monotonic() - start, "threads": snap}) + "\n")
                    f.flush()
                    time.sleep(every)
            os._exit(0)
        os.execvp(rest[0], rest)
    if args and args[0] == "--report":
        samples = [json.loads(l) for l in open(args[1])]
        lo, hi = float(args[2]), float(args[3])
        a = min(samples, key=lambda s: abs(s["t"] - lo))
        b = min(samples, key=lambda s: abs(s["t"] - hi))
        print(table(a["threads"], b["threads"], b["t"] - a["t"])[0])
        return
    pid, seconds = int(args[0]), float(args[1])
    a = read_threads(pid)
    time.sleep(seconds)
    b = read_threads(pid)
    print(table(a, b, seconds)[0])


if __name__ == "__main__":
    main()
