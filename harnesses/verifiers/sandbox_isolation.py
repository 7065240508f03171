"""How the verifier sandbox's child cuts itself off, first thing after it starts (harnesses/verifiers/sandbox.py).

As root (a GPU box, CI), the child

1. enters new mount, PID, network and IPC namespaces. The process that asked stays behind as a
   waiter; its fork is PID 1 of the new PID namespace and serves the calls. Killing the waiter
   (`Sandbox.close()`) kills the server (its parent-death signal), and the kernel then kills
   everything else in that PID namespace: nothing the child starts outlives it;
2. mounts a fresh /proc (no other process is visible), hides each folder above the import path
   that others may not enter (root's 0700 home, where pyenv, uv or conda put Python) under an
   empty tmpfs into which it binds back only the import path, and makes every mount read-only but
   its own working directory;
3. becomes `tracerl-sandbox`, a system user that owns nothing (scripts/setup.sh creates it; else
   `nobody`): root's 0600 files are unreadable, and the worker's files are not writable;
4. sets its resource limits, PR_SET_NO_NEW_PRIVS, and a seccomp filter that kills it on any
   syscall ABI but the native one (i386 `int 0x80` on x86-64, x32 numbers) and refuses fork,
   clone and exec with EPERM (the standard libseccomp pattern).

Not root: the same namespaces inside a new user namespace; the child then stays the worker's
user, so it can read that user's files (not write them: the mounts are read-only). Whatever rule
could not be kept on this machine is listed, in words, in the returned `gaps`, which the parent
logs once (docs/harnesses.md, "The verifier sandbox").
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import signal
import stat
import sys
from typing import Any

SANDBOX_USER = "tracerl-sandbox"  # a system user that owns nothing (scripts/setup.sh creates it)
_NOBODY = 65534
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER = 0x20000, 0x8000000, 0x10000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1  # Linux >= 5.12
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38


def isolate(config: dict, channel: tuple[int, int]) -> dict[str, Any]:
    """Cut this process off as far as the platform allows; returns what it managed (the parent's
    `Sandbox.isolation`). `channel`: the request and reply descriptors, kept by the server only.
    With a PID namespace this returns in the forked server; the waiter never returns."""
    libc = ctypes.CDLL(None, use_errno=True)
    root, gaps = os.geteuid() == 0, []
    info: dict[str, Any] = {"user": "root" if root else "the worker's user", "gaps": gaps}
    account = _sandbox_account(gaps) if root else None
    spaces = _unshare(libc, root, info)
    _die_with_parent(libc, config["parent"])  # after unshare: a new user namespace clears it
    waiter = None
    info["pid"] = os.getpid()
    if spaces & _CLONE_NEWPID:
        info["pid"], waiter = _fork_server(channel)
    paths = _import_path(config["path"])
    info["read_only_files"] = False
    if spaces & _CLONE_NEWNS:
        try:
            info["read_only_files"] = _confine_files(libc, paths, os.getcwd(), bool(spaces & _CLONE_NEWPID), gaps)
        except OSError as e:
            gaps.append(f"files: the mount namespace could not be set up ({e})")
    _set_limits(config)
    if account is not None:
        info["user"] = _drop_root(libc, account, paths, info["read_only_files"], gaps)
    elif spaces & _CLONE_NEWUSER:
        libc.unshare(_CLONE_NEWUSER)  # a nested one: no powers left over the mounts just made
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    info["seccomp"] = _install_seccomp(libc, refuse_processes=not config["allow_fork"])
    info["no_new_processes"] = info["seccomp"] and not config["allow_fork"]
    if waiter is None:
        _die_with_parent(libc, config["parent"])  # after the credentials change, which clears it
    else:
        _die_with_waiter(libc, waiter)
    _note_gaps(info, spaces, root)
    return info


def _sandbox_account(gaps: list[str]) -> tuple[str, int, int]:
    try:
        entry = pwd.getpwnam(SANDBOX_USER)
        return SANDBOX_USER, entry.pw_uid, entry.pw_gid
    except KeyError:
        gaps.append(
            f"user: there is no {SANDBOX_USER} user (scripts/setup.sh creates it when run as root), "
            "so the child runs as nobody, which may own files (NFS with root squash)"
        )
        return "nobody", _NOBODY, _NOBODY


def _unshare(libc: ctypes.CDLL, root: bool, info: dict) -> int:
    """Enter new namespaces: all at once if the kernel allows, else each one that works."""
    uid, gid = os.getuid(), os.getgid()
    user = 0 if root else _CLONE_NEWUSER  # an unprivileged process needs one for the others
    wanted = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC
    if libc.unshare(user | wanted) == 0:
        spaces = user | wanted
    else:
        info["namespace_error"] = os.strerror(ctypes.get_errno())
        spaces = user if user and libc.unshare(user) == 0 else 0
        if root or spaces:
            for flag in (_CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWNS, _CLONE_NEWIPC):
                spaces |= flag if libc.unshare(flag) == 0 else 0
    if spaces & _CLONE_NEWUSER:  # the worker's ids map to themselves; no others exist inside
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return spaces


def _fork_server(channel: tuple[int, int]) -> tuple[int, int]:
    """Fork the server, PID 1 of the new PID namespace; this process waits for it and exits with
    it. In the server, returns its PID as the parent sees it and a descriptor that reads
    end-of-file once the waiter is gone."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write_end)
        word = os.read(read_end, 32)  # the waiter's go, with our PID
        if not word:
            os._exit(0)
        return int(word), read_end
    os.close(read_end)
    for fd in channel:  # the server alone holds the channel: when it dies, the parent reads EOF
        os.close(fd)
    os.write(write_end, b"%d" % pid)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os._exit(code if code >= 0 else 128 - code)


def _import_path(path: list[str]) -> list[str]:
    """What the child imports from, resolved: the parent's sys.path and the interpreter's prefixes."""
    entries = [*path, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    return sorted({os.path.realpath(p) for p in entries if os.path.exists(p)})


def _confine_files(libc: ctypes.CDLL, paths: list[str], cwd: str, pid_namespace: bool, gaps: list) -> bool:
    """In the new mount namespace: a fresh /proc, closed folders above `paths` masked, every mount
    read-only but `cwd`. Returns whether the mounts are read-only."""
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below reaches the worker's mounts
    if pid_namespace:
        try:  # (a container that masks parts of its /proc refuses a new one)
            _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        except OSError as e:
            gaps.append(f"processes: no /proc of its own ({e}), so the child sees the machine's processes")
    for top, under in _masks([*_enterable(paths), cwd]).items():
        _mask(libc, top, under)
    _mount(libc, cwd, cwd, None, _MS_BIND)  # its own mount, the one left writable
    read_only = _set_read_only(libc, "/", True, recursive=True) and _set_read_only(libc, cwd, False)
    os.chdir(cwd)  # into the bind mount, not the folder under it
    return read_only


def _enterable(paths: list[str]) -> list[str]:
    """`paths`, but a folder others may not enter (a checkout cloned into `mktemp -d`, mode 0700) as
    what it holds: masked by a tmpfs of mode 755 into which those are bound back, the sandbox's user
    reaches them; bound back whole, the folder would keep its mode and hide its modules."""
    out: list[str] = []
    for path in paths:
        if os.path.isdir(path) and not os.stat(path).st_mode & stat.S_IXOTH:
            out += [os.path.join(path, name) for name in sorted(os.listdir(path))]
        else:
            out.append(path)
    return out


def _masks(paths: list[str]) -> dict[str, list[str]]:
    """{the highest folder above a path that others may not enter: the paths under it to bind back}."""
    masks: dict[str, list[str]] = {}
    for path in sorted(set(paths)):  # a folder before what it holds
        top = _closed_ancestor(path)
        if top is not None and not any(path.startswith(kept + os.sep) for kept in masks.get(top, [])):
            masks.setdefault(top, []).append(path)
    return masks


def _closed_ancestor(path: str) -> str | None:
    folder = ""
    for part in path.split(os.sep)[1:-1]:
        folder += os.sep + part
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _mask(libc: ctypes.CDLL, top: str, under: list[str]) -> None:
    """An empty tmpfs over `top`, with each path of `under` bound back into it (read through a
    descriptor opened before the tmpfs hides it)."""
    held = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in under]
    _mount(libc, "tmpfs", top, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755,size=1m")
    for path, fd in held:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        os.close(fd)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, kind: str | None, flags: int, data: str = "") -> None:
    def c(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    if libc.mount(c(source), c(target), c(kind), ctypes.c_ulong(flags), c(data or None)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


class _MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def _set_read_only(libc: ctypes.CDLL, path: str, read_only: bool, recursive: bool = False) -> bool:
    flag = _MOUNT_ATTR_RDONLY
    attr = _MountAttr(flag if read_only else 0, 0 if read_only else flag, 0, 0)
    where = (ctypes.c_int(_AT_FDCWD), os.fsencode(path), ctypes.c_uint(_AT_RECURSIVE if recursive else 0))
    return libc.syscall(_SYS_MOUNT_SETATTR, *where, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))) == 0


def _set_limits(config: dict) -> None:
    for limit, value in (
        (resource.RLIMIT_AS, config["memory_bytes"]),
        (resource.RLIMIT_FSIZE, config["file_bytes"]),
        (resource.RLIMIT_NOFILE, config["open_files"]),
    ):
        resource.setrlimit(limit, (value, value))
    if not config["allow_fork"]:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (config["cpu_s"], config["cpu_s"] + 5))


def _drop_root(libc: ctypes.CDLL, account: tuple[str, int, int], paths: list[str], read_only: bool, gaps: list) -> str:
    """Become the sandbox user if it can read the interpreter's files; else shed root's powers in
    a new user namespace, where root's uid still opens root's files. Another folder on the import
    path that the user cannot read (a 0700 one) stays closed to it: the log says so."""
    name, uid, gid = account
    closed = [p for p in paths if not _readable_by_others(p)]
    interpreter = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    if not any(p == top or p.startswith(top + os.sep) for p in closed for top in interpreter):
        gaps.extend(
            f"user: {name} cannot read {p} on the import path: nothing there imports in the child" for p in closed
        )
        os.chown(".", uid, gid)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        return name
    why = f"user: {name} cannot read the interpreter's files ({closed[0]}), so the child stays root"
    if libc.unshare(_CLONE_NEWUSER) != 0:
        gaps.append(f"{why}, with all of root's powers")
        return "root"
    gaps.append(f"{why} in a user namespace, where it can read{'' if read_only else ' and write'} root's files")
    return "root (user namespace)"


def _readable_by_others(path: str) -> bool:
    need = stat.S_IROTH | stat.S_IXOTH if os.path.isdir(path) else stat.S_IROTH  # read, and enter a folder
    while True:
        if os.stat(path).st_mode & need != need:
            return False
        need = stat.S_IXOTH  # ... and enter every folder above
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _die_with_parent(libc: ctypes.CDLL, parent: int) -> None:
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(0)


def _die_with_waiter(libc: ctypes.CDLL, waiter: int) -> None:
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.set_blocking(waiter, False)
    try:
        gone = os.read(waiter, 1) == b""  # end of file: the waiter died before the signal was armed
    except BlockingIOError:
        gone = False
    os.close(waiter)
    if gone:
        os._exit(0)


def _note_gaps(info: dict, spaces: int, root: bool) -> None:
    gaps, why = info["gaps"], info.get("namespace_error", "")
    info["network_isolated"] = bool(spaces & _CLONE_NEWNET)
    info["processes"] = "pid namespace" if spaces & _CLONE_NEWPID else "process group"
    if not root:
        gaps.append("user: the worker is not root, so the child runs as the worker's user and can read its files")
    if not info["network_isolated"]:
        gaps.append(f"network: no network namespace ({why}), so the child can reach the network")
    if not spaces & _CLONE_NEWPID:
        gaps.append(
            f"processes: no PID namespace ({why}); close() kills the child's process group, which a process "
            "it starts can leave"
        )
    if not info["read_only_files"]:
        gaps.append(f"files: no read-only mounts ({why}), so the child can write what its user may write")
    if not info["seccomp"]:
        gaps.append(f"syscalls: no seccomp filter for {os.uname().machine}, so the child can start processes")


# seccomp: kill on another ABI; refuse clone/fork/vfork/execve/clone3/execveat with EPERM.
_SECCOMP_ARCH = {  # machine: (AUDIT_ARCH_*, the refused syscall numbers, the first x32 number)
    "x86_64": (0xC000003E, (56, 57, 58, 59, 322, 435), 0x40000000),
    "aarch64": (0xC00000B7, (220, 221, 281, 435), None),
}
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_EPERM, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000 | 1, 0x80000000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp_program(machine: str, refuse_processes: bool = True) -> list[tuple[int, int, int, int]] | None:
    """The BPF program (code, jump if true, jump if false, k) for `machine`, or None if unknown."""
    if machine not in _SECCOMP_ARCH:
        return None
    audit_arch, numbers, x32 = _SECCOMP_ARCH[machine]
    numbers = numbers if refuse_processes else ()
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    program = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, _RET_KILL_PROCESS)]  # seccomp_data.arch
    program.append((ld, 0, 0, 0))  # seccomp_data.nr
    if x32 is not None:  # the x32 ABI shares x86-64's arch and sets bit 30 of the number
        program += [(jge, 0, 1, x32), (ret, 0, 0, _RET_KILL_PROCESS)]
    n = len(numbers)
    program += [(jeq, n - i, 0, nr) for i, nr in enumerate(numbers)]  # a match jumps to EPERM
    return program + [(ret, 0, 0, _RET_ALLOW), (ret, 0, 0, _RET_EPERM)]


def _install_seccomp(libc: ctypes.CDLL, refuse_processes: bool) -> bool:
    program = _seccomp_program(os.uname().machine, refuse_processes)
    if program is None:
        return False
    filters = (_SockFilter * len(program))(*program)
    prog = _SockFprog(len(program), filters)
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0
