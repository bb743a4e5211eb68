"""A pytest plugin that runs rlms' own REPL tests against the cellbox
environment: rlms' `LocalREPL` is replaced by `CellboxREPL` before the
test modules import it, so every test written for rlms' local REPL (and
every RLM run with environment="local") drives a cellbox session instead.

    python -m pytest -p rlms_as_cellbox RLMS_SRC/tests/test_local_repl.py ...

At the end it says how many cellbox environments the tests made, so a run
that never used one (the swap not taking) is seen.
"""

import rlm.environments
import rlm.environments.local_repl

from cellbox.integrations.rlm import CellboxREPL

made = []


class CountedCellboxREPL(CellboxREPL):
    def __init__(self, *args, **kwargs):
        made.append(1)
        super().__init__(*args, **kwargs)


rlm.environments.local_repl.LocalREPL = CountedCellboxREPL
rlm.environments.LocalREPL = CountedCellboxREPL


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"cellbox environments made: {len(made)}")
