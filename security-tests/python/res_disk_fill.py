# attack: res_disk_fill
# category: resource
# attempts: write a file in scratch in 16 MiB chunks (bounded at 1 GiB; the file is removed afterwards)
# expect: write fails with EFBIG (RLIMIT_FSIZE), ENOSPC or EDQUOT (scratch quota) well before 1 GiB, or the cell is limited
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 20
import errno
import os

CHUNK = b"\0" * (16 * 1024 * 1024)
LIMIT = 1024 * 1024 * 1024
written = 0
failure = None
try:
    with open("fill.bin", "wb") as f:
        while written < LIMIT:
            f.write(CHUNK)
            f.flush()
            written += len(CHUNK)
except OSError as e:
    failure = errno.errorcode.get(e.errno, str(e.errno))
try:
    os.unlink("fill.bin")
except OSError:
    pass
if failure is None:
    print("ATTACK-RESULT: escaped wrote %d MiB to scratch" % (written >> 20), flush=True)
else:
    print("ATTACK-RESULT: blocked %s after %d MiB" % (failure, written >> 20), flush=True)
