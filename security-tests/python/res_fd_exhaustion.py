# attack: res_fd_exhaustion
# category: resource
# attempts: open descriptors until failure (bounded at 20000 pipes' worth)
# expect: EMFILE at the cell's open-files limit well below 20000
# control: no
# canaries: none
import errno
import os

LIMIT = 20000
fds = []
failure = None
try:
    while len(fds) < LIMIT:
        r, w = os.pipe()
        fds += [r, w]
except OSError as e:
    failure = errno.errorcode.get(e.errno, str(e.errno))
n = len(fds)
for fd in fds:
    os.close(fd)
if failure is None:
    print("ATTACK-RESULT: escaped opened %d descriptors" % n, flush=True)
else:
    print("ATTACK-RESULT: blocked %s after %d descriptors" % (failure, n), flush=True)
