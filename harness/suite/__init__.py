"""A suite run from start to end: its plan (what would run where, nothing runs) and the runner (nodes opened,
facts recorded, gates run and evaluated in order, the signed bundle written)."""
