"""CPU time a process has used, as finely as this kernel tells it; and stopping one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def stop(process: subprocess.Popen[bytes], grace_seconds: float = 10.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `grace_seconds`."""
    process.terminate()
    try:
        process.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid`.

    From each thread's `se.sum_exec_runtime` in /proc/<pid>/task/*/sched (nanosecond
    accounting, printed in ms) where the kernel has that file: /proc/<pid>/stat gives the same
    total in clock ticks (10 ms), too coarse for the CPU of a few dozen requests. The threads
    of the processes measured here live as long as the process; a thread that exits takes
    its time out of this sum.
    """
    total, found = 0.0, False
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "sched").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("se.sum_exec_runtime"):
                total += float(line.rsplit(":", 1)[1]) / 1000
                found = True
                break
    if found:
        return total
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks / os.sysconf("SC_CLK_TCK")
