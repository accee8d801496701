"""The runtime directory: which ones we accept, and how files in it are opened.

The reasoning: docs/architecture.md, "Daemon design notes".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from cairnqd.errors import CairnQError


class UnsafeRuntimeDir(CairnQError):
    """The runtime directory, or a file in it, is not one we may trust."""


def open_runtime_dir(path: str, *, create: bool) -> int | None:
    """A descriptor of the runtime directory at `path`, after checking that it is
    ours and nobody else may write to it; None if it does not exist and `create` is
    false. UnsafeRuntimeDir when it fails the checks."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.makedirs(path, mode=0o700)
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeRuntimeDir(f"cannot use runtime directory {path}: {exc.strerror}") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
        raise UnsafeRuntimeDir(
            f"runtime directory {path} is a symlink owned by uid {link.st_uid}: "
            "another user may have planted it; remove it or set runtime_dir"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafeRuntimeDir(f"cannot use runtime directory {path}: {exc.strerror}") from None
    try:
        check_directory(path, os.fstat(fd), owner_may_differ=not create)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_directory(path: str, info: os.stat_result, *, owner_may_differ: bool) -> None:
    """Ours (or, for a reader running as root, any one user's) and writable by
    nobody else. UnsafeRuntimeDir otherwise."""
    euid = os.geteuid()
    if info.st_uid != euid and not (owner_may_differ and euid == 0):
        raise UnsafeRuntimeDir(
            f"runtime directory {path} belongs to uid {info.st_uid}, not to this process "
            f"(uid {euid}): another user may have planted it; remove it or set runtime_dir"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(info.st_mode)
        raise UnsafeRuntimeDir(
            f"runtime directory {path} is writable by group or others (mode {mode:04o}): "
            f"anyone could plant files in it; chmod go-w {path} or set runtime_dir"
        )


def open_in(dir_fd: int, directory: str, name: str, flags: int) -> int:
    """Open `name` in the directory, never through a symlink, creating it 0600 when
    `flags` say so; it must be a regular file owned by the directory's owner."""
    where = os.path.join(directory, name)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise UnsafeRuntimeDir(f"{where} is a symlink: refusing to follow it") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeRuntimeDir(f"{where} is not a regular file")
        owner = os.fstat(dir_fd).st_uid
        if info.st_uid != owner:
            raise UnsafeRuntimeDir(
                f"{where} belongs to uid {info.st_uid}, not to the directory's owner "
                f"(uid {owner}): refusing it"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd
