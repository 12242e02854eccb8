"""Removing what an episode left behind, whatever shape it has.

An episode's directory is normally its own tmpfs, and one unmount removes it. Where it is a
plain directory (no mount namespace), the tree may be anything the episode could build in its
time: thousands of levels deep, which makes a recursive walk (shutil.rmtree) raise
RecursionError or run out of descriptors. `rmtree` here walks iteratively, holds at most two
directory descriptors at a time, never follows a symlink, and never raises: what it cannot
remove it leaves, and says so. A tree too big to remove at once is left to a throw-away child
process, so that it does not hold up the worker's other episodes.
"""

from __future__ import annotations

import errno
import os
import stat

from . import namespaces

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def rmtree(path: str, limit: int | None = None) -> bool | None:
    """Remove `path` and everything below it. True if it is gone, False if something resisted,
    None if it stopped after `limit` entries."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
            return True
        fd = os.open(path, _DIR)
    except OSError:
        return False
    ok = _empty(fd, limit)
    if ok is None:
        return None
    try:
        os.rmdir(path)
    except OSError:
        return False
    return ok


def _empty(top: int, limit: int | None) -> bool | None:
    """Empty the directory open as `top` (and close it): go down to a directory without
    subdirectories, delete its files, go back up through "..", delete it, repeat. `names` is
    the way down from `top`; `stuck` counts entries that resisted, so the walk always ends."""
    fd, names, stuck, budget = top, [], set(), limit
    try:
        while True:
            if budget is not None:
                budget -= 1
                if budget < 0:
                    return None
            sub = None
            with os.scandir(fd) as it:
                for e in it:
                    if budget is not None:
                        budget -= 1
                        if budget < 0:
                            return None
                    key = (len(names), e.name)
                    if key in stuck:
                        continue
                    try:
                        is_dir = e.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if is_dir:
                        sub = e.name
                        break
                    try:
                        os.unlink(e.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        stuck.add(key)
            if sub is not None:
                try:
                    nfd = os.open(sub, _DIR, dir_fd=fd)
                except OSError:
                    stuck.add((len(names), sub))
                    continue
                os.close(fd)
                fd = nfd
                names.append(sub)
                continue
            if not names:
                return not stuck
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            name = names.pop()
            stuck = {k for k in stuck if k[0] <= len(names)}  # entries below are gone or given up
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    stuck.add((len(names), name))
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_episode_dir(path: str) -> int | None:
    """Unmount the episode's tmpfs if it has one, then remove the (now empty) directory. A tree
    left on disk (no tmpfs) is renamed aside and removed by a throw-away child process, so that
    the worker goes on serving: returns that child's pid, for the caller to reap."""
    namespaces.unmount(path)
    try:
        os.rmdir(path)
        return None
    except FileNotFoundError:
        return None
    except OSError:
        pass
    if rmtree(path, limit=1024) is not None:  # done, or given up: nothing more to try
        return None
    aside = f"{path}.gone"
    try:
        os.rename(path, aside)
    except OSError:
        aside = path
    try:
        pid = os.fork()
    except OSError:
        rmtree(aside)
        return None
    if pid == 0:
        try:
            rmtree(aside)
        finally:
            os._exit(0)
    return pid
