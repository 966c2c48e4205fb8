"""Hangs across ranks: Flight Recorder dumps read safely (``dumps``), joined per process group
and sequence number into a verdict (``attribution``), with each rank's stack (``stacks``) and a
text form (``render``). Pure: no textual, no torch."""

from gputop.diagnostics.hang.attribution import HangFinding, HangReport, attribute
from gputop.diagnostics.hang.dumps import (
    MAX_DUMP_BYTES,
    DumpError,
    FrDump,
    FrEntry,
    read_dump,
    read_dump_bytes,
)
from gputop.diagnostics.hang.stacks import RankStack, StackFrame

__all__ = ["MAX_DUMP_BYTES", "DumpError", "FrDump", "FrEntry", "HangFinding", "HangReport",
           "RankStack", "StackFrame", "attribute", "read_dump", "read_dump_bytes"]
