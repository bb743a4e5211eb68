# cellbox: start a Python cell from the precompiled shim (python3 -I -S -B -c <this>).
# fd 4 holds, until EOF, marshal.dumps((shim code, cold code)) as printed by
# `python3 -I -S -B -c <shim.py> --precompile` from this same interpreter.
import marshal, posix
_b = []
while True:
    _c = posix.read(4, 1 << 16)
    if not _c:
        break
    _b.append(_c)
posix.close(4)
_shim, _COLD_CODE = marshal.loads(b"".join(_b))
del _b, _c
exec(_shim)
