# The compiled scan (recording/_scan.c): fastjournal._scan_block's contract.
import mmap

def scan_block(
    buffer: mmap.mmap | bytes,
    start: int,
    end: int,
    wanted: tuple[bytes, ...],
    unwanted: tuple[bytes, ...],
    expected: list[bytes] | None,
    /,
) -> tuple[list[float], bytes, list[bytes] | None] | None: ...
def scan_series(
    buffer: mmap.mmap | bytes,
    start: int,
    end: int,
    wanted: tuple[bytes, ...],
    unwanted: tuple[bytes, ...],
    /,
) -> list[tuple[bytes, bytes, bytes, bool]] | None: ...
