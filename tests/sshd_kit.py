"""Real OpenSSH servers for the fleet tests and benchmark (no pytest needed here): Debian's sshd on 127.0.0.x, each
with a private configuration, a throwaway host key, and a throwaway user key for the client.

Each node's "gputop" is this checkout's gputop on the node's own demo scenario: the sshd of a
node sets GPUTOP_NODE_SCENARIO (sshd_config SetEnv) and the wrapper script given as
--remote-gputop runs `python -m gputop --demo $GPUTOP_NODE_SCENARIO "$@"`. The client side is
an ssh config file passed with --ssh-config (ssh -F), so nothing reads or writes ~/.ssh.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"


def kill_tree(proc: psutil.Process, timeout: float = 30.0) -> None:
    """SIGKILL a process and everything under it (listed before anything dies)."""
    try:
        victims = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        victims = [proc]
    for victim in victims:
        try:
            victim.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=timeout)


def sshd_missing() -> str | None:
    """Why real sshd nodes cannot run here, or None."""
    for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")):
        if not tool or not os.path.exists(tool):
            return "needs OpenSSH (Debian's openssh-server and openssh-client)"
    return None


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gputop-test", "-f",
                    str(path)], check=True, capture_output=True, timeout=60)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else \
        Path(str(path) + ".pub").read_text().strip()


@dataclass
class Node:
    name: str  # the ssh alias
    address: str
    port: int
    scenario: str
    config: Path
    proc: subprocess.Popen | None = None
    share: Callable[[subprocess.Popen], object] | None = None  # conftest's share_process

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        if self.share is not None:
            self.share(self.proc)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd for {self.name} exited: "
                                   f"{self.proc.stderr.read().decode(errors='replace')}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """The node goes away: sshd and every session under it (gputop stream included)."""
        if self.proc is None:
            return
        try:
            kill_tree(psutil.Process(self.proc.pid))
        except psutil.NoSuchProcess:
            pass
        self.proc.wait(30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None


class Cluster:
    """``Cluster(tmp, {"node-a": "input-starved", ...}).start()``; ``stop()`` ends it all."""

    def __init__(self, root: Path, scenarios: dict[str, str], first_address: int = 2,
                 share: Callable[[subprocess.Popen], object] | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        self.user = getpass.getuser()
        host_key = root / "host_key"
        host_pub = _keygen(host_key)
        self.user_key = root / "id_ed25519"
        user_pub = _keygen(self.user_key)
        (root / "authorized_keys").write_text(user_pub + "\n")
        self.wrapper = root / "node-gputop"
        hostile = REPO / "tests" / "scripts" / "hostile_stream.py"
        self.wrapper.write_text(
            "#!/bin/sh\n"
            "# This checkout's gputop on the node's own demo scenario (set by its sshd); a\n"
            "# hostile-KIND node runs tests/scripts/hostile_stream.py KIND instead, and a\n"
            "# 'missing' node has no gputop at all.\n"
            f"export PYTHONPATH={REPO}\n"
            'case "$GPUTOP_NODE_SCENARIO" in\n'
            f'  hostile-*) exec {sys.executable} {hostile} "${{GPUTOP_NODE_SCENARIO#hostile-}}" ;;\n'
            '  missing) exec /nonexistent/gputop "$@" ;;\n'
            "esac\n"
            f'exec {sys.executable} -m gputop --demo "$GPUTOP_NODE_SCENARIO" "$@"\n')
        self.wrapper.chmod(0o755)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        self.nodes: dict[str, Node] = {}
        known = []
        for i, (name, scenario) in enumerate(scenarios.items()):
            address = f"127.0.0.{first_address + i}"
            port = free_port(address)
            config = root / f"sshd_{name}.conf"
            config.write_text("\n".join([
                f"ListenAddress {address}:{port}",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "PidFile none",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                f"AllowUsers {self.user}",
                "MaxStartups 200",
                "MaxSessions 100",
                "LogLevel ERROR",
                f"SetEnv GPUTOP_NODE_SCENARIO={scenario}",
                "",
            ]))
            self.nodes[name] = Node(name, address, port, scenario, config, share=share)
            known.append(f"[{address}]:{port} {host_pub}")
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        self.ssh_config = root / "ssh_config"
        blocks = []
        for node in self.nodes.values():
            blocks.append("\n".join([
                f"Host {node.name}",
                f"  HostName {node.address}",
                f"  Port {node.port}",
                f"  User {self.user}",
                f"  IdentityFile {self.user_key}",
                "  IdentitiesOnly yes",
                "  IdentityAgent none",
                f"  UserKnownHostsFile {root / 'known_hosts'}",
                "  GlobalKnownHostsFile /dev/null",
                "  StrictHostKeyChecking yes",
                "",
            ]))
        self.ssh_config.write_text("\n".join(blocks))

    def start(self) -> Cluster:
        for node in self.nodes.values():
            node.start()
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def fleet_args(self) -> list[str]:
        """The options that point `gputop --hosts` at these nodes."""
        return ["--hosts", ",".join(self.nodes), "--ssh-config", str(self.ssh_config),
                "--remote-gputop", str(self.wrapper)]

    def ssh(self, name: str, command: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", name,
                               command], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
