"""A real two-node Slurm cluster on this machine, in a scratch folder, for tests.

Debian's ``slurm-wlm`` (22.05) and ``munge``: one ``munged`` with its own key and socket, one
``slurmctld`` and two ``slurmd -N n1|n2``, each node declaring ``Gres=gpu:h100:4`` backed by
character devices made with ``mknod`` (gres.conf refuses regular files), every state, spool,
pid and log path under the scratch folder and free ports on 127.0.0.1; ``SLURM_CONF`` points
at it. Both nodes have the address 127.0.0.1. ``start_cluster`` returns None with the reason
when the programs are absent, this is not root (slurmd runs as root), or the daemons do not
come up; ``Cluster.stop`` cancels every job and ends the daemons it started (by their pids).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
NODES = ("n1", "n2")
GPUS_PER_NODE = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    pid_files: list[Path] = field(default_factory=list)

    def run(self, *argv: str, timeout_s: float = 20) -> str:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout_s,
                              check=False).stdout  # fmt: skip

    def jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").split()

    def log_tail(self) -> str:
        out = []
        for p in sorted((self.root / "log").glob("*.log")):
            lines = p.read_text(errors="replace").splitlines()[-5:]
            out.append(f"== {p.name} ==\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        try:
            self.run("scancel", "--user", str(os.getuid()))
        except (OSError, subprocess.SubprocessError):
            pass
        deadline = time.monotonic() + 10
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid_file in reversed(self.pid_files):  # slurmds, slurmctld, munged
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                end = time.monotonic() + wait
                while time.monotonic() < end and _alive(pid):
                    time.sleep(0.05)
                if not _alive(pid):
                    break


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our child not yet reaped) is gone for this purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def start_cluster(root: Path) -> tuple[Cluster | None, str]:
    """(the cluster, "") or (None, why not)."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return None, f"Slurm/munge not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return None, "slurmd must run as root to start job steps; this is not root"
    for d in ("munge", "state", "log", "run", *(f"spool/{n}" for n in NODES), *(f"dev/{n}" for n in NODES)):
        (root / d).mkdir(parents=True, exist_ok=True)
    try:
        for n in NODES:
            for i in range(GPUS_PER_NODE):
                os.mknod(root / "dev" / n / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
    except OSError as exc:
        return None, f"cannot make the GPU character devices gres.conf needs: {exc}"
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "munge").chmod(0o700)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cluster = Cluster(root, env)
    sock = root / "munge" / "munge.sock"
    munged = subprocess.run(["munged", f"--key-file={key}", f"--socket={sock}", f"--pid-file={root}/munge/munged.pid",
                             f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed", "--force"],
                            capture_output=True, text=True, timeout=20, check=False)  # fmt: skip
    cluster.pid_files.append(root / "munge" / "munged.pid")
    if munged.returncode != 0:
        return None, f"munged did not start: {munged.stderr.strip()}"
    host = socket.gethostname()
    ports = [_free_port() for _ in range(2 + len(NODES))]
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[2 + i]} CPUs=8 RealMemory=1000 "
        f"Gres=gpu:h100:{GPUS_PER_NODE} State=UNKNOWN"
        for i, n in enumerate(NODES)
    )
    (root / "slurm.conf").write_text(f"""ClusterName=benchtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
{node_lines}
PartitionName=gpu Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")
    (root / "gres.conf").write_text("".join(
        f"NodeName={n} Name=gpu Type=h100 File={root}/dev/{n}/nvidia[0-{GPUS_PER_NODE - 1}]\n" for n in NODES))  # fmt: skip
    starts = [["slurmctld", "-c"], *(["slurmd", "-N", n] for n in NODES)]
    cluster.pid_files += [root / "run" / "slurmctld.pid", *(root / "run" / f"slurmd-{n}.pid" for n in NODES)]
    for argv in starts:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20, check=False)
        if out.returncode != 0:
            cluster.stop()
            return None, f"{' '.join(argv)} did not start: {out.stderr.strip()}\n{cluster.log_tail()}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").split()
        if states.count("idle") == len(NODES):
            return cluster, ""
        time.sleep(0.1)
    why = f"the Slurm nodes did not become idle within 20 s ({' '.join(states)})\n{cluster.log_tail()}"
    cluster.stop()
    return None, why
