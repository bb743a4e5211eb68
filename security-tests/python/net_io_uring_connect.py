# attack: net_io_uring_connect
# category: network
# attempts: create a socket and connect it to the loopback TCP listener with io_uring opcodes (IORING_OP_SOCKET, IORING_OP_CONNECT), which seccomp cannot inspect
# expect: io_uring_setup fails (EPERM/ENOSYS from seccomp); the listener sees nothing
# control: yes
# canaries: tcp
import ctypes
import errno
import mmap
import socket
import struct


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR_SETUP, NR_ENTER = 425, 426


def fail(what):
    e = ctypes.get_errno()
    report("blocked", "%s:%s" % (what, errno.errorcode.get(e, str(e))))


params = ctypes.create_string_buffer(120)
ring_fd = libc.syscall(ctypes.c_long(NR_SETUP), ctypes.c_uint(4), params)
if ring_fd < 0:
    fail("io_uring_setup")
else:
    sq_entries, cq_entries, _flags, _cpu, _idle, features = struct.unpack_from("=6I", params, 0)
    sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("=7I", params, 40)
    cq_head, cq_tail, cq_mask, _, _, cqes = struct.unpack_from("=6I", params, 80)
    sq_size = sq_array + sq_entries * 4
    cq_size = cqes + cq_entries * 16
    single = features & 1
    if single:
        sq_size = cq_size = max(sq_size, cq_size)
    sq = mmap.mmap(ring_fd, sq_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
    cq = sq if single else mmap.mmap(ring_fd, cq_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0x8000000)
    sqes = mmap.mmap(ring_fd, sq_entries * 64, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0x10000000)

    def submit(opcode, fd, off, addr, length, op_flags=0):
        tail = struct.unpack_from("=I", sq, sq_tail)[0]
        idx = tail & struct.unpack_from("=I", sq, sq_mask)[0]
        sqe = bytearray(64)
        struct.pack_into("=BBHiQQIIQ", sqe, 0, opcode, 0, 0, fd, off, addr, length, op_flags, 7)
        sqes[idx * 64:(idx + 1) * 64] = bytes(sqe)
        struct.pack_into("=I", sq, sq_array + idx * 4, idx)
        struct.pack_into("=I", sq, sq_tail, tail + 1)
        n = libc.syscall(ctypes.c_long(NR_ENTER), ctypes.c_uint(ring_fd), ctypes.c_uint(1), ctypes.c_uint(1),
                         ctypes.c_uint(1), None, ctypes.c_size_t(0))
        if n < 0:
            return None
        head = struct.unpack_from("=I", cq, cq_head)[0]
        slot = head & struct.unpack_from("=I", cq, cq_mask)[0]
        _ud, res, _fl = struct.unpack_from("=QiI", cq, cqes + slot * 16)
        struct.pack_into("=I", cq, cq_head, head + 1)
        return res

    IORING_OP_SOCKET, IORING_OP_CONNECT, IORING_OP_SEND = 45, 16, 26
    sfd = submit(IORING_OP_SOCKET, socket.AF_INET, socket.SOCK_STREAM, 0, 0)
    if sfd is None:
        fail("io_uring_enter")
    elif sfd < 0:
        report("blocked", "IORING_OP_SOCKET:" + errno.errorcode.get(-sfd, str(-sfd)))
    else:
        addr = ctypes.create_string_buffer(struct.pack("=H", socket.AF_INET) + struct.pack(">H", {{TCP_PORT}}) + socket.inet_aton("127.0.0.1") + b"\0" * 8)
        res = submit(IORING_OP_CONNECT, sfd, 16, ctypes.addressof(addr), 0)
        if res is None:
            fail("io_uring_enter")
        elif res < 0:
            report("blocked", "IORING_OP_CONNECT:" + errno.errorcode.get(-res, str(-res)))
        else:
            msg = ctypes.create_string_buffer(b"{{MARKER}} io_uring\n")
            submit(IORING_OP_SEND, sfd, 0, ctypes.addressof(msg), len(msg.value))
            report("escaped", "connected to 127.0.0.1:{{TCP_PORT}} through io_uring")
