# cellbox: start a Python cell, or a zygote, from the precompiled shim:
#     python3 -I -S -B -c <this file> PATH [--zygote CONFIG]
# PATH holds marshal.dumps((sys.hexversion, shim code, cold code, zygote
# code)), as printed by `python3 -I -S -B -c <shim.py> --precompile
# <zygote.py>` run by this same interpreter (marshalled code is specific to
# one Python version, hence the check). The shim then sees the arguments
# after PATH.
import marshal, sys
with open(sys.argv[1], "rb") as _f:
    _version, _shim, _COLD_CODE, _ZYGOTE_CODE = marshal.loads(_f.read())
if _version != sys.hexversion:
    sys.stderr.write("cellbox: the precompiled Python shim was made by another Python version\n")
    raise SystemExit(7)
del _f, _version
sys.argv[1:2] = []
exec(_shim)
