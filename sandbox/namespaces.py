"""The namespaces and the file-system view of a worker, set up once at its start.

A worker leaves the host's network, mount, System V IPC and pid namespaces (as root directly;
otherwise inside a user namespace, where the kernel allows one). The pid namespace needs a
fork: the process the pool started stays outside as a supervisor that only waits, and its child
becomes the zygote, pid 1 of the new namespace. When pid 1 of a namespace dies, the kernel kills
every process in it, so no episode outlives its worker, whatever it did to its own
parent-death signal; and an episode can name only the processes of its own worker.

In its private mount namespace the zygote then mounts a size- and inode-capped tmpfs and makes it
the root (`pivot_root`): the standard library directories bound read-only at their usual paths,
`/dev/null`, `/dev/zero`, `/dev/urandom`, and `/ep`, where each episode mounts its own tmpfs.
Nothing else of the host's file system has a name there, so an episode cannot even test which
host files exist. Every step is best effort and reported as a fact; the probe and the pool's
`require` setting judge what took effect.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
CLONE_NEWIPC, CLONE_NEWPID = 0x08000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 0x4000, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
DEVICES = ("null", "zero", "urandom")
EPISODES = "/ep"  # where episode directories live once the worker has its own root
ROOT_INODES = 65536  # the worker's tmpfs holds mount points, one per live episode


def unshare_worker() -> dict:
    """Leave the host's namespaces; the largest set the kernel allows. Returns facts."""
    facts = {"netns": False, "mountns": False, "userns": False, "ipcns": False, "pidns": False}
    uid, gid = os.getuid(), os.getgid()
    user = CLONE_NEWUSER if uid != 0 else 0  # unprivileged: a user namespace lets us make the rest
    everything = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID
    for flags in (everything, everything & ~CLONE_NEWPID, CLONE_NEWNET | CLONE_NEWIPC, CLONE_NEWNET):
        if _libc.unshare(flags | user) == 0:
            break
    else:
        return facts
    facts.update(netns=True, mountns=bool(flags & CLONE_NEWNS), ipcns=bool(flags & CLONE_NEWIPC),
                 pidns=bool(flags & CLONE_NEWPID), userns=bool(user))
    if user:
        # Identity map: files keep their owners, and the host can still signal the worker.
        for path, data in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                           ("/proc/self/gid_map", f"{gid} {gid} 1")):
            with open(path, "w") as f:
                f.write(data)
    return facts


def maps_uid_range(lo: int, n: int) -> bool:
    """Whether this user namespace maps every uid in [lo, lo + n) (read before the new root)."""
    try:
        with open("/proc/self/uid_map") as f:
            rows = [tuple(map(int, line.split())) for line in f if line.strip()]
    except (OSError, ValueError):
        return False
    return any(inside <= lo and lo + n <= inside + count for inside, _, count in rows)


def _mount(src, target: str, fstype, flags: int, data: str | None = None) -> bool:
    return _libc.mount(src and src.encode(), target.encode(), fstype and fstype.encode(), flags,
                       data and data.encode()) == 0


def private_root(tmp_root: str, tmpfs_bytes: int, read_dirs: list[str]) -> dict:
    """A capped tmpfs at `tmp_root` (a directory that exists: mounted over in this namespace
    only), then (where possible) that tmpfs as the root. Returns facts: tmpfs, host_view (the
    root moved) and episodes (where episode directories go)."""
    facts = {"tmpfs": False, "host_view": False, "episodes": tmp_root}
    # Private propagation first, or our mounts would show up in the host's namespace.
    if not _mount("none", "/", None, MS_REC | MS_PRIVATE):
        return facts
    opts = f"size={tmpfs_bytes},nr_inodes={ROOT_INODES},mode=0711"
    if not _mount("tmpfs", tmp_root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts):
        return facts
    facts["tmpfs"] = True
    if SYS_PIVOT_ROOT is None:
        return facts
    try:
        _build_root(tmp_root, read_dirs)
        os.chdir(tmp_root)
        if _libc.syscall(SYS_PIVOT_ROOT, b".", b".") != 0:
            raise OSError(ctypes.get_errno(), "pivot_root")
        # The old root is now stacked under the new one: detach it, and the host is gone.
        if _libc.umount2(b".", MNT_DETACH) != 0:
            raise OSError(ctypes.get_errno(), "umount of the old root")
        os.chdir("/")
    except OSError:
        os.chdir("/")
        return facts
    facts.update(host_view=True, episodes=EPISODES)
    return facts


def _build_root(new: str, read_dirs: list[str]) -> None:
    tops = [d for d in sorted(set(read_dirs)) if not any(d.startswith(o + "/") for o in read_dirs)]
    for d in tops:
        target = new + d
        os.makedirs(target, 0o755, exist_ok=True)
        if not _mount(d, target, None, MS_BIND | MS_REC):
            raise OSError(ctypes.get_errno(), f"bind {d}")
        # Read-only where the kernel lets us; the directories belong to root anyway.
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.makedirs(new + "/dev", 0o755, exist_ok=True)
    for name in DEVICES:
        target = f"{new}/dev/{name}"
        open(target, "w").close()
        if not _mount(f"/dev/{name}", target, None, MS_BIND):
            raise OSError(ctypes.get_errno(), f"bind /dev/{name}")
    os.makedirs(new + EPISODES, 0o711, exist_ok=True)
    os.chmod(new + EPISODES, 0o711)


def mount_episode_tmpfs(path: str, size: int, inodes: int, uid: int) -> bool:
    """The episode's own tmpfs, owned by its uid: its files count against its own caps, and its
    worker removes it with one unmount, whatever tree the episode built inside."""
    opts = f"size={size},nr_inodes={inodes},mode=0700,uid={uid},gid={uid}"
    return _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)


def unmount(path: str) -> bool:
    return _libc.umount2(path.encode(), MNT_DETACH) == 0
