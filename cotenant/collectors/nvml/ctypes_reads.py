"""Reading pynvml's ctypes answers fast: process utilization samples and field values.

pynvml answers ``nvmlDeviceGetProcessUtilization`` with a list of structures viewing one
ctypes array, and ``nvmlDeviceGetFieldValues`` with a ctypes array. Unpacking the buffer
behind them at once with :mod:`struct` / :class:`memoryview` avoids several reads per item
through pynvml's Python-level ``__getattribute__`` (about 0.8 µs each), which at 10 Hz over
8 GPUs x 20 processes is most of a poll. Anything not laid out as expected (another binding,
another struct version) is read attribute by attribute, with the same result.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

from cotenant.collectors.nvml.api import FieldValue, NvmlApi, ProcessSample

# NVML value type -> member of the c_nvmlValue_t union, and how to read its 8 bytes
_VALUE_TYPES = (
    ("DOUBLE", "dVal", "=d"),
    ("UNSIGNED_INT", "uiVal", "=I4x"),
    ("UNSIGNED_LONG", "ulVal", "=Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "=L4x"),
    ("UNSIGNED_LONG_LONG", "ullVal", "=Q"),
    ("SIGNED_LONG_LONG", "sllVal", "=q"),
    ("SIGNED_INT", "siVal", "=i4x"),
    ("UNSIGNED_SHORT", "usVal", "=H6x"),
)


class CLayout:
    """A C structure pynvml declares (ctypes), read in bulk with :mod:`struct`.

    ``fmt`` is the :mod:`struct` format of one record (its size must be the structure's);
    ``offsets`` the byte offset of each field the format relies on, checked against the
    structure class before its bytes are trusted.
    """

    def __init__(self, fmt: str, offsets: dict[str, int]) -> None:
        self.struct = struct.Struct(fmt)
        self._offsets = offsets
        self._matches: dict[type, bool] = {}

    def raw(self, items: Sequence[object]) -> bytes | None:
        """The bytes behind ``items`` (a non-empty sequence), or None if not laid out so."""
        first = items[0]
        if isinstance(items, ctypes.Array):
            base: Any = items
        elif isinstance(first, ctypes.Structure):  # skip pynvml's __getattribute__ override
            base = object.__getattribute__(first, "_b_base_")
        else:
            return None
        if not (
            isinstance(base, ctypes.Array)
            and isinstance(first, ctypes.Structure)
            and self._match(type(first))
        ):
            return None
        start = ctypes.addressof(first)
        if start != ctypes.addressof(base) or len(base) < len(items):
            return None
        return ctypes.string_at(start, len(items) * self.struct.size)

    def _match(self, cls: type) -> bool:
        ok = self._matches.get(cls)
        if ok is None:
            try:
                at = {name: getattr(cls, name).offset for name in self._offsets}
                ok = at == self._offsets and ctypes.sizeof(cls) == self.struct.size
            except (AttributeError, TypeError):
                ok = False
            self._matches[cls] = ok
        return ok


# c_nvmlProcessUtilizationSample_t: pid, timeStamp, smUtil, memUtil (encUtil, decUtil skipped)
SAMPLE = CLayout("=I4xQII8x", {"pid": 0, "timeStamp": 8, "smUtil": 16, "memUtil": 20})
# c_nvmlFieldValue_t: timestamp, valueType, nvmlReturn, and the value union as 8 raw bytes
FIELD_VALUE = CLayout(
    "=8xq8xII8s", {"timestamp": 8, "valueType": 24, "nvmlReturn": 28, "value": 32}
)


def sample_columns(
    samples: Sequence[ProcessSample],
) -> tuple[list[int], list[int], list[int], list[int]]:
    """``pid``, ``timeStamp`` (µs), ``smUtil``, ``memUtil`` (percent) of NVML process
    utilization samples (non-empty), as columns (sliced out of the C array at C speed where
    pynvml gave one)."""
    raw = SAMPLE.raw(samples)
    if raw is None:
        return (
            [s.pid for s in samples],
            [s.timeStamp for s in samples],
            [s.smUtil for s in samples],
            [s.memUtil for s in samples],
        )
    u32, u64 = memoryview(raw).cast("I"), memoryview(raw).cast("Q")  # 32-byte records
    return u32[0::8].tolist(), u64[1::4].tolist(), u32[4::8].tolist(), u32[5::8].tolist()


def pair(obj: object, a: str, b: str) -> tuple[Any, Any]:
    """Two fields of an NVML structure; ctypes' own lookup skips pynvml's Python-level
    ``__getattribute__`` override (which only decodes bytes; these fields are numbers)."""
    get = object.__getattribute__ if isinstance(obj, ctypes.Structure) else getattr
    return get(obj, a), get(obj, b)


class FieldValueReader:
    """Decodes ``nvmlDeviceGetFieldValues`` answers of ``nv`` (whose value type codes it
    reads once)."""

    def __init__(self, nv: NvmlApi[Any]) -> None:
        codes = {
            "DOUBLE": nv.NVML_VALUE_TYPE_DOUBLE,
            "UNSIGNED_INT": nv.NVML_VALUE_TYPE_UNSIGNED_INT,
            "UNSIGNED_LONG": nv.NVML_VALUE_TYPE_UNSIGNED_LONG,
            "UNSIGNED_LONG_LONG": nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            "SIGNED_LONG_LONG": nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG,
            "SIGNED_INT": nv.NVML_VALUE_TYPE_SIGNED_INT,
            "UNSIGNED_SHORT": nv.NVML_VALUE_TYPE_UNSIGNED_SHORT,
        }
        self._attr = {codes[t]: a for t, a, _ in _VALUE_TYPES}
        self._fmt = {codes[t]: struct.Struct(f) for t, _, f in _VALUE_TYPES}

    def read(self, values: Sequence[FieldValue]) -> list[tuple[int, int, float | None]]:
        """Per value, in order: (timestamp µs, ``nvmlReturn``, the value; None where the
        return code is not success or the value type is unknown)."""
        raw = FIELD_VALUE.raw(values)
        fmt, attr = self._fmt, self._attr
        out: list[tuple[int, int, float | None]] = []
        if raw is None:
            for fv in values:
                stamp, vtype, ret = fv.timestamp, fv.valueType, fv.nvmlReturn
                ok = ret == 0 and vtype in attr
                out.append((stamp, ret, getattr(fv.value, attr[vtype]) if ok else None))
        else:
            for stamp, vtype, ret, value in FIELD_VALUE.struct.iter_unpack(raw):
                ok = ret == 0 and vtype in fmt
                out.append((stamp, ret, fmt[vtype].unpack(value)[0] if ok else None))
        return out
