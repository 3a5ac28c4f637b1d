# The compiled scan (recording/_scan.c): a piece of a strict recording's family block.
import mmap

def scan_series(
    buffer: mmap.mmap | bytes,
    start: int,
    end: int,
    wanted: tuple[bytes, ...],
    unwanted: tuple[bytes, ...],
    /,
) -> list[tuple[bytes, bytes, bytes, bool]] | None: ...
