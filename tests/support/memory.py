"""A process's memory from /proc/<pid>/status: its resident set now (VmRSS) and at its peak
(VmHWM), which `reset_peak` sets back to the current size before what is measured."""

from pathlib import Path


def memory_kb(pid: int) -> dict[str, int]:
    """{"VmRSS": kB, "VmHWM": kB} of the process."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(line.split()[1])
    return found


def reset_peak(pid: int) -> None:
    # "5" resets the peak resident set size to the current one (proc(5), /proc/<pid>/clear_refs);
    # allowed on one's own processes.
    Path(f"/proc/{pid}/clear_refs").write_text("5")
