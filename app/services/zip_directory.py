"""How many entries an uploaded zip holds, read before `zipfile.ZipFile` parses its central directory.

ZipFile reads the whole central directory (the archive's list of files) into memory and makes an object of
each entry as it opens the archive: 600,000 entries cost 4 s and 200 MB, and a 200 MB upload can list
3.5 million. So the end-of-central-directory record (and its zip64 twin) is read first, from the last
64 KB of the file, and an archive that lists too many entries, or whose directory is too large, is
refused. The record's count can lie (ZipFile parses the directory by its size, not by the count): the
directory's bytes are also scanned, in 1 MB pieces, for entry signatures, which every entry starts with.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import IO

_EOCD = struct.Struct("<4s4H2LH")  # signature, disks, entries on this disk, entries, size, offset, comment
_LOCATOR64 = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # …, entries on this disk, entries, size, offset
_ENTRY = b"PK\x01\x02"
_PIECE = 1 << 20


@dataclass(frozen=True)
class Directory:
    entries: int  # as the end record says
    size: int  # bytes of the central directory, which ZipFile reads and parses
    start: int  # where it starts in the file, as ZipFile computes it


def read_directory(fp: IO[bytes]) -> Directory | None:
    """The end record's figures, found as ZipFile finds them (the last signature in the file's last
    22 + 65,535 bytes; the zip64 record just before its locator); None when there is none."""
    end = fp.seek(0, 2)
    tail_len = min(end, _EOCD.size + 0xFFFF)
    fp.seek(end - tail_len)
    tail = fp.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _EOCD.size > len(tail):
        return None
    *_, entries, size, _offset, _comment = _EOCD.unpack_from(tail, at)
    where = end - tail_len + at
    if where >= _LOCATOR64.size + _EOCD64.size:
        fp.seek(where - _LOCATOR64.size - _EOCD64.size)
        record = fp.read(_EOCD64.size + _LOCATOR64.size)
        if record[_EOCD64.size : _EOCD64.size + 4] == b"PK\x06\x07" and record[:4] == b"PK\x06\x06":
            *_, entries, size, _offset = _EOCD64.unpack_from(record)
            where -= _LOCATOR64.size + _EOCD64.size
    return Directory(entries, size, max(where - size, 0))


def count_entries(fp: IO[bytes], directory: Directory, stop_after: int) -> int:
    """Entry signatures in the directory's bytes (at least its real number of entries), counted up to just
    past `stop_after`; 1 MB is held at a time."""
    fp.seek(directory.start)
    left, count, carry = directory.size, 0, b""
    while left > 0 and count <= stop_after:
        piece = fp.read(min(_PIECE, left))
        if not piece:
            break
        left -= len(piece)
        data = carry + piece
        count += data.count(_ENTRY)
        carry = data[-3:]  # the start of a signature split across two pieces (3 bytes never hold a whole one)
    return count


def check(fp: IO[bytes], max_entries: int, max_bytes: int) -> str | None:
    """Why this archive's directory is too large to read (in words for the person who uploaded it), or None.
    Leaves the file's position at its start."""
    try:
        directory = read_directory(fp)
        if directory is None:
            return None  # not a zip: ZipFile says so
        if directory.entries > max_entries:
            return (
                f"the archive lists {directory.entries:,} entries (files and folders); at most {max_entries:,} are read"
            )
        if directory.size > max_bytes:
            return (
                f"the archive's list of files is {directory.size / 2**20:,.0f} MB long; at most "
                f"{max_bytes / 2**20:,.0f} MB are read"
            )
        found = count_entries(fp, directory, max_entries)
        if found > max_entries:
            return (
                f"the archive holds more than {max_entries:,} entries (files and folders; its end record "
                f"claims {directory.entries:,}); at most {max_entries:,} are read"
            )
        return None
    finally:
        fp.seek(0)
