# attack: proc_int80_i386
# category: process
# attempts: 32-bit syscalls through `int 0x80` from a 64-bit process (i386 numbering: getpid=20, unshare=310), from an RWX page
# expect: mmap of an executable writable page fails, or the filter (which must check the audit arch) kills/denies: SIGSYS, EPERM or ENOSYS
# control: yes
# canaries: none
import ctypes
import errno
import mmap


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
except OSError as e:
    report("blocked", "rwx mmap:" + errno.errorcode.get(e.errno, str(e.errno)))
else:
    # mov eax, 20 ; int 0x80 ; ret                       -> getpid()
    # mov eax, 310 ; mov ebx, 0x10000000 ; int 0x80 ; ret -> unshare(CLONE_NEWUSER)
    getpid_code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
    unshare_code = bytes([0xB8, 0x36, 0x01, 0, 0, 0xBB, 0, 0, 0, 0x10, 0xCD, 0x80, 0xC3])
    page.write(getpid_code)
    page.seek(64)
    page.write(unshare_code)
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    getpid32 = ctypes.CFUNCTYPE(ctypes.c_int)(base)
    unshare32 = ctypes.CFUNCTYPE(ctypes.c_int)(base + 64)
    got = []
    denials = []
    r = getpid32()
    if r > 0:
        got.append("getpid=%d" % r)
    else:
        denials.append("getpid:" + errno.errorcode.get(-r, str(-r)))
    r = unshare32()
    if r == 0:
        got.append("unshare(CLONE_NEWUSER)")
    else:
        denials.append("unshare:" + errno.errorcode.get(-r, str(-r)))
    if got:
        report("escaped", "i386 syscalls ran: " + ",".join(got))
    else:
        report("blocked", " ".join(denials))
