"""Pure parsers of command output (tested on captured real output under tests/fixtures/)."""
