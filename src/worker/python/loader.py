# cellbox: start a Python cell from the precompiled shim:
#     python3 -I -S -B -c <this file> PATH
# PATH holds marshal.dumps((sys.hexversion, shim code, cold code)), as printed
# by `python3 -I -S -B -c <shim.py> --precompile` run by this same interpreter
# (marshalled code is specific to one Python version, hence the check).
import marshal, sys
with open(sys.argv[1], "rb") as _f:
    _version, _shim, _COLD_CODE = marshal.loads(_f.read())
if _version != sys.hexversion:
    sys.stderr.write("cellbox: the precompiled Python shim was made by another Python version\n")
    raise SystemExit(7)
del _f, _version
exec(_shim)
