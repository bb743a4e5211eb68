# cellbox Python runtime shim (replaced by the full shim).
import os, sys
sys.stderr.write("cellbox: the Python shim is not built yet\n")
os._exit(7)
