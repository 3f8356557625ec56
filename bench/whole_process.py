"""Whole-process throughput of a command that trains for a given number of steps, with start-up cancelled.

The command runs for N1 steps three times and for N2 steps once. The first N1 run only warms the file cache (and fills
caches such as a GEMM tactic file); the other two time start-up plus N1 steps. The rate is
batch x (N2 - N1) / (wall(N2) - mean wall(N1)). Start-up varies from run to run (half a second to a second for a
large export), and the two timed N1 runs measure that spread: when it exceeds MAX_SPREAD of the difference the rate
is not reported (null, with a note asking for more steps) instead of a figure that is mostly start-up noise.
"""
import statistics
import time

MAX_SPREAD = 0.05


def whole_process_rate(run, n1, n2, batch):
    """run(n) starts the command for n steps and returns its CompletedProcess. Returns (the last CompletedProcess,
    which is the failing one if any run failed, and the fields to record; None on a failure)."""
    walls = {n1: [], n2: []}
    for n in (n1, n1, n1, n2):
        t = time.monotonic()
        r = run(n)
        walls[n].append(time.monotonic() - t)
        if r.returncode != 0:
            return r, None
    timed = walls[n1][1:]
    diff = walls[n2][0] - statistics.mean(timed)
    spread = max(timed) - min(timed)
    fields = dict(wall_s={str(n1): [round(w, 3) for w in walls[n1]], str(n2): round(walls[n2][0], 3)},
                  whole_process_spread=round(spread / diff, 4) if diff > 0 else None)
    if diff <= 0 or spread > MAX_SPREAD * diff:
        fields["samples_s_whole_process"] = None
        fields["whole_process_note"] = (f"start-up varied by {spread:.2f} s between two runs of {n1} steps, over "
                                        f"{MAX_SPREAD:.0%} of the {diff:.2f} s that {n2 - n1} more steps took: not "
                                        "reported; give more steps")
    else:
        fields["samples_s_whole_process"] = batch * (n2 - n1) / diff
    return r, fields
