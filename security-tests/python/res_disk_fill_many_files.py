# attack: res_disk_fill_many_files
# category: resource
# attempts: write 48 files of 32 MiB each (1.5 GiB) in scratch: each file stays under RLIMIT_FSIZE, the total does not (the files are removed afterwards)
# expect: the scratch quota (a 1 GiB tmpfs shared by the supervisor's cells) stops the writes with ENOSPC before 1.5 GiB reach the host's disk
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 30
import errno
import os

CHUNK = b"\0" * (32 * 1024 * 1024)
FILES = 48
written = 0
failure = None
try:
    for i in range(FILES):
        with open("fill%d.bin" % i, "wb") as f:
            f.write(CHUNK)
        written += len(CHUNK)
except OSError as e:
    failure = errno.errorcode.get(e.errno, str(e.errno))
for i in range(FILES):
    try:
        os.unlink("fill%d.bin" % i)
    except OSError:
        pass
if failure is None:
    print("ATTACK-RESULT: escaped wrote %d MiB to scratch in %d files" % (written >> 20, FILES), flush=True)
else:
    print("ATTACK-RESULT: blocked %s after %d MiB" % (failure, written >> 20), flush=True)
