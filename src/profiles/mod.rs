//! Sandbox profiles: operator-editable descriptions of what a cell may do.
