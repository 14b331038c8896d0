"""Start a calibration worker the way its users start training: torchrun, or DeepSpeed's launcher.

The worker is a module (`python -m calibrate.<room>.<worker> ...` under the launcher). Each rank writes
its result through `calibrate.harness.worker_io.write_result` into a private directory named by
$CALIBRATE_OUT; the launcher reads them back. Anything a run can do wrong (an OOM, a crashed or
hung rank, a timeout) comes back as an Outcome with that status, never as an exception of the
harness. The launcher runs in its own session and process group, so a timeout, a dead rank,
Ctrl-C or (with raise_on_sigterm, as `python -m calibrate` does) SIGTERM kills the launcher and
every rank it started (no orphans).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHERS = ("torchrun", "deepspeed")
STATUSES = ("ok", "oom", "crash", "timeout")
_OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "out of memory", "DefaultCPUAllocator: can't allocate")


@dataclass
class Outcome:
    """What one launched run produced."""

    status: str
    """ok | oom | crash | timeout."""
    returncode: int | None
    """The launcher's exit status (None after a timeout)."""
    wall_s: float
    """Seconds from start to the end of the last rank."""
    ranks: list = field(default_factory=list)
    """Each rank's result dict, by rank (ranks that wrote nothing are missing)."""
    log_tail: str = ""
    """The last lines of the ranks' combined stdout/stderr."""
    error: str = ""
    """The first exception line a rank printed ('RuntimeError: ...'), empty when none."""

    def to_json(self) -> dict:
        return {"status": self.status, "returncode": self.returncode, "wall_s": round(self.wall_s, 3),
                "error": self.error, "log_tail": self.log_tail}


def command(module: str, args: list, nproc: int, launcher: str = "torchrun", hostfile: str | None = None,
            master_port: int | None = None) -> list:
    """The command line a user would type for `nproc` processes per node."""
    if launcher == "torchrun":
        # torch/distributed/run.py: --standalone picks a free rendezvous port on localhost
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", module, *map(str, args)]
    if launcher == "deepspeed":
        # deepspeed/launcher/runner.py: --num_gpus per node (CPU accelerator too), --module, --hostfile
        base = [sys.executable, "-m", "deepspeed.launcher.runner", f"--num_gpus={nproc}", "--master_port",
                str(master_port or _free_port())]
        if hostfile:
            base += ["--hostfile", hostfile]
        return [*base, "--module", module, *map(str, args)]
    raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _remove_shm_buffers(port: int) -> None:
    """Remove the shared-memory allreduce buffers DeepSpeed's CPU accelerator left for the run on
    `port`: ops/csrc/cpu/comm/shm.cpp shm_initialize creates /dev/shm/deepspeed_allreduce_buffer_
    <uid>_<addr>_<port>_<rank> (69 MB each in 0.19.8) and nothing unlinks it, so every launch would
    leave them in memory (CI: 2 x 69 MB a launch)."""
    for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
        path.unlink(missing_ok=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by raise_on_sigterm's handler. A KeyboardInterrupt, so that
    it unwinds exactly as Ctrl-C does: launch() kills the launcher's group on the way out."""


def raise_on_sigterm():
    """Make SIGTERM raise Terminated; returns the previous handler (None when not in the main thread,
    where no handler can be installed). Without it SIGTERM (a scheduler's cancel, `timeout`) kills
    only this process: the launcher and its ranks, in a session of their own, see no signal and run
    on as orphans."""

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's process group, SIGKILL what is left after 5 s."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_.]*(?:Error|Exception|Interrupt)): (.*)$", re.M)


def first_error(log: str) -> str:
    """The first 'SomeError: message' line of the ranks' output (torchrun's own summary follows it)."""
    m = _EXCEPTION.search(log)
    return f"{m.group(1)}: {m.group(2)}"[:500] if m else ""


def classify(returncode: int | None, log: str, timed_out: bool) -> str:
    """ok | oom | crash | timeout from the launcher's exit and the ranks' log."""
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    return "oom" if any(m in log for m in _OOM_MARKERS) else "crash"


def launch(module: str, args: list = (), nproc: int = 2, timeout_s: float = 300.0, launcher: str = "torchrun",
           hostfile: str | None = None, env: dict | None = None, tail_lines: int = 40) -> Outcome:
    """Run `module` on `nproc` ranks under `launcher`; return its Outcome (never raises for a failed
    run; Ctrl-C, or SIGTERM under raise_on_sigterm, kills the ranks and re-raises)."""
    port = _free_port() if launcher == "deepspeed" else None
    cmd = command(module, list(args), nproc, launcher, hostfile, port)
    with tempfile.TemporaryDirectory(prefix="calibrate-") as out:
        run_env = {**os.environ, **(env or {}), "CALIBRATE_OUT": out}
        run_env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default; keeps 2-core hosts responsive
        start = time.perf_counter()
        log_path = Path(out) / "log.txt"
        with open(log_path, "w+b") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env, start_new_session=True,
                                    cwd=str(Path(__file__).resolve().parents[2]))
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:  # Ctrl-C, SIGTERM (Terminated): leave no orphan rank behind
                _kill_group(proc)
                raise
            else:
                _kill_group(proc)  # a launcher that exited early may leave ranks in its group
            finally:
                if port is not None:
                    _remove_shm_buffers(port)
        wall_s = time.perf_counter() - start
        text = log_path.read_text(errors="replace")
        ranks = []
        for path in sorted(Path(out).glob("rank*.json"), key=lambda p: int(p.stem[4:])):
            try:
                ranks.append(json.loads(path.read_text()))
            except ValueError:
                pass  # a rank killed while writing: its result is missing, the status says why
        status = classify(proc.returncode, text, timed_out)
        return Outcome(status, None if timed_out else proc.returncode, wall_s, ranks,
                       "\n".join(text.splitlines()[-tail_lines:]), first_error(text))
