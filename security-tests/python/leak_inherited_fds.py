# attack: leak_inherited_fds
# category: leak
# attempts: probe every descriptor 3..1023 and read any regular file or socket it finds (the harness leaves one open on the supervisor)
# expect: only the cell's own pipes exist (0, 1, 2 and the protocol fd); no inherited file is readable
# control: yes
# canaries: none
import os
import stat

found = []
for fd in range(3, 1024):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    try:
        target = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        target = "?"
    kind = "reg" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "fifo" if stat.S_ISFIFO(st.st_mode) else "sock" if stat.S_ISSOCK(st.st_mode) else "other"
    print("fd %d %s %s" % (fd, kind, target))
    if kind == "reg":
        try:
            print(os.pread(fd, 4096, 0).decode("latin-1"))
            found.append(fd)
        except OSError:
            pass
    elif kind == "dir":
        found.append(fd)
if found:
    print("ATTACK-RESULT: escaped inherited files/dirs on fds %s" % found, flush=True)
else:
    print("ATTACK-RESULT: blocked no inherited file descriptors", flush=True)
