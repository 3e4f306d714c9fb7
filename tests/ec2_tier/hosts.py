"""Namespace hosts: what `ray up` needs from an EC2 instance (an sshd whose `docker` is that host's own daemon,
`--net=host` meaning that host's network), one network namespace and one mount namespace per host.

Layout (10.252.0.0/24, names prefixed `rayup-<pid>-` / `ry<pid>` so parallel work never collides):
a switch namespace holds a bridge; this machine's end `ry<pid>h` has 10.252.0.1 (the tier's servers:
the fake cloud, moto); host i gets 10.252.0.(i+2) on its `eth0`. The bridge lives in its own namespace so
this machine's iptables (another daemon's FORWARD DROP) never sees the traffic between hosts.

Nothing leaves the subnet. A host's default route (Ray finds its node IP by the route to 8.8.8.8: ray 2.58.0
ray/_private/services.py node_ip_address_from_perspective) points at the bridge's own address 10.252.0.254, in
the switch namespace, which forwards nothing; not at this machine, which forwards (ip_forward=1) to its real
network. Names resolve as a VPC's resolver would answer them, at once: each host's /etc/hosts names every host
(ip-10-252-0-N, the form of an EC2 private DNS name) and its /etc/resolv.conf names only its own loopback, where
nothing listens, so any other lookup fails at once. With this machine's resolver every lookup (c10d's reverse
lookup of its peers, `getent`) waited 10 s for a resolver that does not answer from the subnet.

Each host's processes (dockerd with its containerd, and sshd) share one private mount namespace in which
/run, /tmp and /home are the host's own, and /etc/passwd has `ec2-user` (uid 0: the DLAMI's ec2-user may run
docker and sudo; this machine has no sudo). dockerd is started inside it, not with `ip netns exec` (which
remounts /sys and hides the cgroup mounts: /work/shared/netns-hosts.md). Everything is stopped by PID: the
processes found in the host's network namespace (sshd, dockerd, containerd, shims, containers).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.waiting import descendants
from tests.ec2_tier.image import CACHE, Image

SUBNET = "10.252.0"
GATEWAY = f"{SUBNET}.1"
ROUTER = f"{SUBNET}.254"
"""The hosts' default route: the bridge's address in the switch namespace, which forwards nothing."""
SSH_USER = "ec2-user"
DOCKERD_START_S = 60.0
SSHD_START_S = 15.0


def sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


def require_tools() -> None:
    """Fail (never skip) when the tier's programs are missing: CI installs them (.ci/run)."""
    import shutil

    missing = [t for t in ("ip", "nsenter", "unshare", "dockerd", "docker", "/usr/sbin/sshd", "ssh", "ssh-keygen",
                           "rsync", "ldd") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"the ray up tier needs {', '.join(missing)}: apt-get install docker.io openssh-server "
                           "openssh-client rsync iproute2 debootstrap util-linux")
    if os.geteuid() != 0:
        raise RuntimeError("the ray up tier makes network namespaces and runs dockerd: run it as root")


@dataclass
class Host:
    name: str
    index: int
    ip: str
    netns: str
    dir: Path
    data_root: Path
    sshd: subprocess.Popen | None = None
    net_inode: int = 0
    dockerd_cmd: str = ""
    sshd_cmd: str = ""
    log: list[str] = field(default_factory=list)

    @property
    def dns_name(self) -> str:
        """The name a VPC's resolver gives this private IP (the region's suffix left out)."""
        return "ip-" + self.ip.replace(".", "-")

    @property
    def docker_sock(self) -> Path:
        return self.dir / "docker.sock"

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """This host's daemon, from this machine (its second socket under the host's directory)."""
        return sh("docker", "-H", f"unix://{self.docker_sock}", *args, check=check, timeout=timeout)

    def containers(self) -> list[str]:
        out = self.docker("ps", "-a", "--format", "{{.Names}}", check=False)
        return out.stdout.split() if out.returncode == 0 else []

    def remove_containers(self) -> None:
        ids = self.docker("ps", "-aq", check=False).stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, check=False)

    def pids(self) -> list[int]:
        """Every process in this host's network namespace (sshd, dockerd, containerd, shims, containers)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == self.net_inode and int(entry) != os.getpid():
                    found.append(int(entry))
        return found


class Lab:
    """The switch, the hosts, their keys; `start()` brings the hosts up, `close()` removes everything."""

    def __init__(self, image: Image, *, hosts: tuple[str, ...] = ("head", "worker")):
        self.pid = os.getpid()
        self.prefix = f"rayup-{self.pid}-"
        self.ifprefix = f"ry{self.pid}"
        # Not under /tmp: each host binds its own directory over /tmp, which would hide this one.
        self.root = Path(f"/var/tmp/rayup-{self.pid}")
        self.image = image
        self.switch = f"{self.prefix}sw"
        self.hosts = [Host(name, i, f"{SUBNET}.{i + 2}", f"{self.prefix}{name}", self.root / name,
                           CACHE / "docker" / image.tag.split(":")[1] / name) for i, name in enumerate(hosts)]
        self.key = self.root / "id_ed25519"
        self.made_netns: list[str] = []
        self.made_links: list[str] = []

    # ---- the network -----------------------------------------------------------------------------
    def _netns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.made_netns.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def _network(self) -> None:
        self._netns(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        sh("ip", "netns", "exec", self.switch, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward")
        sh("ip", "-n", self.switch, "addr", "add", f"{ROUTER}/24", "dev", "br0")
        here = f"{self.ifprefix}h"
        sh("ip", "link", "add", here, "type", "veth", "peer", "name", f"{here}s")
        self.made_links.append(here)
        sh("ip", "link", "set", f"{here}s", "netns", self.switch)
        sh("ip", "-n", self.switch, "link", "set", f"{here}s", "master", "br0", "up")
        sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", here)
        sh("ip", "link", "set", here, "up")
        for host in self.hosts:
            self._netns(host.netns)
            end = f"{self.ifprefix}n{host.index}"
            sh("ip", "link", "add", end, "type", "veth", "peer", "name", f"{end}s")
            self.made_links.append(end)
            sh("ip", "link", "set", f"{end}s", "netns", self.switch)
            sh("ip", "-n", self.switch, "link", "set", f"{end}s", "master", "br0", "up")
            sh("ip", "link", "set", end, "netns", host.netns)
            sh("ip", "-n", host.netns, "link", "set", end, "name", "eth0")
            sh("ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            sh("ip", "-n", host.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", host.netns, "route", "add", "default", "via", ROUTER)
            host.net_inode = os.stat(f"/var/run/netns/{host.netns}").st_ino

    # ---- one host ----------------------------------------------------------------------------------
    def _files(self, host: Host, shim_dir: Path | None) -> str:
        d = host.dir
        for sub in ("tmp", "home", "sbin"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        home = d / "home" / SSH_USER
        home.mkdir(mode=0o700, exist_ok=True)
        # As an AMI's /etc/skel gives ec2-user: Ray sources ~/.bashrc before every command.
        skel = Path("/etc/skel/.bashrc")
        (home / ".bashrc").write_text(skel.read_text() if skel.exists() else "")
        (d / "tmp").chmod(0o1777)
        host.data_root.mkdir(parents=True, exist_ok=True)
        passwd = Path("/etc/passwd").read_text()
        (d / "passwd").write_text(passwd + f"{SSH_USER}:x:0:0:EC2 user:/home/{SSH_USER}:/bin/bash\n")
        shadow = Path("/etc/shadow").read_text()
        (d / "shadow").write_text(shadow + f"{SSH_USER}:*:19000:0:99999:7:::\n")
        (d / "shadow").chmod(0o600)
        names = "".join(f"{h.ip} {h.dns_name}\n" for h in self.hosts)
        (d / "hosts").write_text(Path("/etc/hosts").read_text().rstrip("\n") + "\n" + names)
        (d / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        hostkey = d / "ssh_host_ed25519_key"
        if not hostkey.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey))
        (d / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        (d / "sshd_config").write_text("\n".join([
            f"ListenAddress {host.ip}", "Port 22", f"HostKey {hostkey}", f"PidFile {d}/sshd.pid",
            f"AuthorizedKeysFile {d}/authorized_keys", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "MaxStartups 100", "MaxSessions 100", "AcceptEnv LANG LC_*", ""]))
        mounts = [
            "mount -t tmpfs tmpfs /run", "mkdir -p /run/sshd",
            f"mount --bind {d}/tmp /tmp", f"mount --bind {d}/home /home",
            f"mount --bind {d}/passwd /etc/passwd", f"mount --bind {d}/shadow /etc/shadow",
            _bind_onto_target(d / "hosts", "/etc/hosts"), _bind_onto_target(d / "resolv.conf", "/etc/resolv.conf"),
            # /usr/local/sbin is first on a root login shell's PATH (Debian /etc/profile): the `aws` shim.
            f"mount --bind {shim_dir or d / 'sbin'} /usr/local/sbin",
        ]
        dockerd = shlex.join([
            "dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
            "--ip-masq=false", "--userland-proxy=false", f"--data-root={host.data_root}",
            "--exec-root=/run/docker-exec", "-H", "unix:///run/docker.sock", "-H", f"unix://{host.docker_sock}",
            f"--pidfile={d}/dockerd.pid"])
        host.dockerd_cmd = f"(setsid {dockerd} >>{d}/dockerd.log 2>&1 &)"
        host.sshd_cmd = f"exec /usr/sbin/sshd -D -e -f {d}/sshd_config"
        return " && ".join(["set -e", *mounts, host.dockerd_cmd, host.sshd_cmd])

    def _start_host(self, host: Host, shim_dir: Path | None) -> None:
        script = self._files(host, shim_dir)
        with open(host.dir / "sshd.log", "wb") as log:
            host.sshd = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{host.netns}", "unshare", "-m", "--propagation", "private",
                 "sh", "-c", script], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_host(self, host: Host) -> None:
        deadline = time.monotonic() + DOCKERD_START_S
        while True:
            if host.docker("version", "--format", "{{.Server.Version}}", check=False, timeout=10).returncode == 0:
                break
            if time.monotonic() > deadline or host.sshd.poll() is not None:
                raise RuntimeError(f"{host.name}: dockerd did not start in {DOCKERD_START_S:.0f} s:\n"
                                   + _tail(host.dir / "dockerd.log") + _tail(host.dir / "sshd.log"))
            time.sleep(0.5)
        deadline = time.monotonic() + SSHD_START_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host.ip, 22), timeout=2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name}: sshd did not listen in {SSHD_START_S:.0f} s:\n"
                                   + _tail(host.dir / "sshd.log"))
            time.sleep(0.2)
        # A cached data root may hold containers of an earlier run that was killed: an instance starts empty.
        host.remove_containers()
        if host.docker("image", "inspect", self.image.tag, check=False).returncode != 0:
            args = [a for change in self.image.changes for a in ("--change", change)]
            host.docker("import", *args, str(self.image.tarball), self.image.tag, timeout=300)

    def start(self, shim_dir: Path | None = None, before_hosts=None) -> Lab:
        require_tools()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        if not self.key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ray-up-tier", "-f", str(self.key))
        try:
            self._network()
            if before_hosts is not None:
                before_hosts()
            for host in self.hosts:
                self._start_host(host, shim_dir)
            for host in self.hosts:
                self._wait_host(host)
        except BaseException:
            self.close()
            raise
        return self

    def stop_host(self, host: Host) -> None:
        """Stop one host's daemons and containers, by PID; the host can be started again."""
        host.remove_containers()
        pidfile = host.dir / "dockerd.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(pidfile):
            time.sleep(0.2)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in host.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while host.pids() and time.monotonic() < deadline:
                time.sleep(0.1)
        if host.sshd is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.sshd.wait(timeout=5)

    # ---- failures for the bad-input tests: one daemon down, then back (the other keeps the mount namespace) --
    def _in_host(self, host: Host, anchor_pid: int, script: str, log: str) -> subprocess.Popen:
        with open(host.dir / log, "ab") as out:
            return subprocess.Popen(["nsenter", f"--net=/var/run/netns/{host.netns}",
                                     f"--mount=/proc/{anchor_pid}/ns/mnt", "sh", "-c", script],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def dockerd_pid(self, host: Host) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            pid = int((host.dir / "dockerd.pid").read_text())
            os.kill(pid, 0)
            return pid
        return None

    def stop_sshd(self, host: Host) -> None:
        """The host stops answering SSH: the daemon and every connection it serves. A connection an earlier `ray up`
        left open (Ray's ssh ControlMaster, ControlPersist) outlives a stopped listener and would carry the next
        `ray up`'s first commands through, so that `ray up` failed on its first new connection instead of waiting
        for SSH (seen in 2 of 3 full runs of this module)."""
        serving = descendants(host.sshd.pid)
        host.sshd.send_signal(signal.SIGTERM)
        for pid in serving:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        host.sshd.wait(timeout=10)

    def start_sshd(self, host: Host) -> None:
        host.sshd = self._in_host(host, self.dockerd_pid(host), host.sshd_cmd, "sshd.log")
        deadline = time.monotonic() + SSHD_START_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host.ip, 22), timeout=2):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name}: sshd did not come back:\n" + _tail(host.dir / "sshd.log"))
            time.sleep(0.2)

    def stop_dockerd(self, host: Host) -> None:
        host.remove_containers()
        pid = self.dockerd_pid(host)
        if pid:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while self.dockerd_pid(host) and time.monotonic() < deadline:
                time.sleep(0.2)

    def start_dockerd(self, host: Host) -> None:
        self._in_host(host, host.sshd.pid, host.dockerd_cmd, "dockerd.log").wait(timeout=10)
        deadline = time.monotonic() + DOCKERD_START_S
        while host.docker("version", check=False, timeout=10).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name}: dockerd did not come back:\n" + _tail(host.dir / "dockerd.log"))
            time.sleep(0.5)

    def close(self) -> None:
        for host in self.hosts:
            if host.net_inode:
                with contextlib.suppress(Exception):
                    self.stop_host(host)
        for link in self.made_links:
            sh("ip", "link", "del", link, check=False)
        for name in reversed(self.made_netns):
            sh("ip", "netns", "del", name, check=False)
        self.made_links.clear()
        self.made_netns.clear()
        if not any(h.pids() for h in self.hosts if h.net_inode):
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)


def _bind_onto_target(src: Path, dest: str) -> str:
    """`mount --bind src` onto the file `dest` resolves to, made if missing: a resolv.conf that links into /run
    (systemd-resolved's stub) points into the host's own, empty /run by the time this runs."""
    return (f't=$(readlink -m {dest}) && mkdir -p "$(dirname "$t")" && {{ [ -e "$t" ] || : > "$t"; }} && '
            f'mount --bind {src} "$t"')


def _alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def _tail(path: Path, n: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) + "\n"
    return ""
