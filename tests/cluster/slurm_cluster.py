"""A real two-node Slurm cluster on this machine, in a scratch folder, for tests.

Debian's ``slurm-wlm`` (22.05) and ``munge``: one ``munged`` with its own key and socket, one
``slurmctld`` and two ``slurmd -N n1|n2``, each node declaring ``Gres=gpu:h100:4`` backed by
character devices made with ``mknod`` (gres.conf refuses regular files), every state, spool,
pid and log path under the scratch folder and free ports on 127.0.0.1; ``SLURM_CONF`` points
at it. Both nodes have the address 127.0.0.1, or, with ``netns``, each slurmd runs in its own
network namespace on a bridge, at its own address. ``start_cluster`` returns None with the reason
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


class Netns:
    """Each node's own network namespace, joined by a bridge: node i at ``addresses[i]``, the
    launching host (this namespace) at ``gateway``. A namespace is held by a ``sleep`` started
    with ``unshare -n``; a daemon enters it with ``nsenter --net=/proc/PID/ns/net`` (not ``ip
    netns exec``, which remounts /sys, where slurmd then fails)."""

    def __init__(self, nodes: int) -> None:
        tag = f"{os.getpid() % 100000}"
        self.bridge = f"bbr{tag}"
        subnet = 100 + os.getpid() % 150
        self.gateway = f"10.213.{subnet}.1"
        self.addresses = [f"10.213.{subnet}.{10 + i}" for i in range(nodes)]
        self.veths = [f"bv{tag}n{i}" for i in range(nodes)]
        self.holders: list[subprocess.Popen[bytes]] = []

    @staticmethod
    def _ip(*argv: str, pid: int | None = None) -> None:
        cmd = (["nsenter", f"--net=/proc/{pid}/ns/net"] if pid else []) + ["ip", *argv]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        if out.returncode != 0:
            raise OSError(f"{' '.join(cmd)}: {out.stderr.strip()}")

    def start(self) -> str:
        """"" when up, else why not (then nothing of it is left)."""
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            for veth, addr in zip(self.veths, self.addresses):
                hold = subprocess.Popen(["unshare", "-n", "sleep", "infinity"])
                self.holders.append(hold)
                self._wait_own_netns(hold.pid)
                self._ip("link", "add", veth, "type", "veth", "peer", "name", veth + "p")
                self._ip("link", "set", veth + "p", "netns", str(hold.pid))
                self._ip("link", "set", veth, "master", self.bridge)
                self._ip("link", "set", veth, "up")
                self._ip("link", "set", "lo", "up", pid=hold.pid)
                self._ip("addr", "add", f"{addr}/24", "dev", veth + "p", pid=hold.pid)
                self._ip("link", "set", veth + "p", "up", pid=hold.pid)
                self._ip("route", "add", "default", "via", self.gateway, pid=hold.pid)
        except OSError as exc:
            self.stop()
            return f"network namespaces not permitted here: {exc}"
        return ""

    @staticmethod
    def _wait_own_netns(pid: int) -> None:
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if os.readlink(f"/proc/{pid}/ns/net") != mine:
                    return
            except OSError:
                pass
            time.sleep(0.01)
        raise OSError("unshare -n made no namespace")

    def enter(self, i: int) -> list[str]:
        return ["nsenter", f"--net=/proc/{self.holders[i].pid}/ns/net"]

    def stop(self) -> None:
        for hold in self.holders:
            hold.kill()
            hold.wait()
        for name in [*self.veths, self.bridge]:
            subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=10, check=False)


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    pid_files: list[Path] = field(default_factory=list)
    #: the nodes' own network namespaces, when the cluster has them
    netns: Netns | None = None

    @property
    def addresses(self) -> list[str]:
        """Each node's address."""
        return list(self.netns.addresses) if self.netns is not None else ["127.0.0.1"] * len(NODES)

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
        if self.netns is not None:
            self.netns.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our child not yet reaped) is gone for this purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def start_cluster(root: Path, netns: bool = False) -> tuple[Cluster | None, str]:
    """(the cluster, "") or (None, why not). ``netns``: each slurmd in its own network
    namespace (``Netns``), so the nodes have distinct addresses."""
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
    if netns:
        cluster.netns = Netns(len(NODES))
        why = cluster.netns.start()
        if why:
            return None, why
    sock = root / "munge" / "munge.sock"
    munged = subprocess.run(["munged", f"--key-file={key}", f"--socket={sock}", f"--pid-file={root}/munge/munged.pid",
                             f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed", "--force"],
                            capture_output=True, text=True, timeout=20, check=False)  # fmt: skip
    cluster.pid_files.append(root / "munge" / "munged.pid")
    if munged.returncode != 0:
        cluster.stop()
        return None, f"munged did not start: {munged.stderr.strip()}"
    host = socket.gethostname()
    ports = [_free_port() for _ in range(2 + len(NODES))]
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr={cluster.addresses[i]} Port={ports[2 + i]} CPUs=8 RealMemory=1000 "
        f"Gres=gpu:h100:{GPUS_PER_NODE} State=UNKNOWN"
        for i, n in enumerate(NODES)
    )
    (root / "slurm.conf").write_text(f"""ClusterName=benchtest
SlurmctldHost=localhost({cluster.netns.gateway if cluster.netns else "127.0.0.1"})
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
    starts = [["slurmctld", "-c"],
              *([*(cluster.netns.enter(i) if cluster.netns else []), "slurmd", "-N", n] for i, n in enumerate(NODES))]
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
