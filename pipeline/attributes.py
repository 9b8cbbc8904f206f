"""Attribute types: each owns its public domain and how the stream maps values to codes.

A deployment declares every attribute's domain up front (``pipeline.config``); nothing here looks at
the data. Codes are integers in ``[0, size)``. Report parsing marks a value the report did not carry
with :data:`MISSING` and a value outside the domain with :data:`OUT_OF_DOMAIN` (rejected at intake).

Every attribute type provides the same methods, so no caller branches on the type:

* :meth:`decoder` — one report value -> its code, or None when outside the domain;
* :meth:`column_decoder` — a column of values -> codes, with :data:`MISSING` for ``null`` and
  :data:`OUT_OF_DOMAIN` for values outside the domain;
* :meth:`code` — the code of a value written in the configuration (an imputation default, a band
  monitor's watched value);
* :meth:`in_domain` — whether a configured value (label or code) names a member of the domain;
* :meth:`is_label` — whether a string names a member of the domain;
* :meth:`public_labels` — names of codes, taken only from the public domain (declared values or a
  hashed attribute's public dictionary): never looked up in the private reports;
* :meth:`wire_values` — codes as a client sends them (categorical: the labels; else the codes);
* :meth:`csv_value` — a CSV cell as the report value.

Accepted spellings (what a pandas user produces where its meaning is unambiguous): an integral float
wherever an integer code is accepted; for binary attributes also ``"0"``/``"1"``, ``"0.0"``/``"1.0"``
and ``"true"``/``"false"`` in any case. A bool is never a categorical code or a hashed id, and a
string there is a label or a hashed value, never a number.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from pipeline.validation import StrictModel

__all__ = [
    "MISSING",
    "OUT_OF_DOMAIN",
    "public_hash",
    "BinaryAttribute",
    "CategoricalAttribute",
    "HashedAttribute",
    "Attribute",
]

MISSING = -1  # the report did not carry the attribute (imputed at step close)
OUT_OF_DOMAIN = -2  # the value is outside the attribute's public domain (rejected)
HINT_LABELS = (
    12  # labels an out_of_domain detail lists (a long list is cut: dead-letter details are bounded)
)


def public_hash(value: str, size: int) -> int:
    """Public, deterministic map of an open-domain string to an id in [0, size) (BLAKE2b-64)."""
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % size


# A CSV cell is a whole number when, without these spaces around it, it is an optional sign and
# ASCII digits (not "1_0" or other scripts' digits, which Python's int() would also take). One rule
# for the per-report reader (csv_value) and the upload's whole columns (pipeline.upload_columns),
# so a cell's code does not depend on which of them reads the file
CSV_SPACE = " \t\r\n\v\f\u00a0"
CSV_INTEGER = r"^[+-]?[0-9]+$"
_CSV_INTEGER = re.compile(CSV_INTEGER)

_BINARY_STRINGS = {"0": 0, "1": 1, "0.0": 0, "1.0": 1, "false": 0, "true": 1}


def _coerced_binary(v) -> int | None:
    """A binary value as pandas writes it: 0.0/1.0, "0"/"1", "0.0"/"1.0", "true"/"false" in any case."""
    if type(v) is float:
        return int(v) if v == 0.0 or v == 1.0 else None
    if type(v) is str:
        return _BINARY_STRINGS.get(v.lower())
    return None


def _integral_float(v, size: int) -> int | None:
    """An integral float in [0, size) as its integer (a pandas float column of codes), else None."""
    if type(v) is float and v.is_integer() and 0 <= v < size:
        return int(v)
    return None


def _or_out(code: int | None) -> int:
    return OUT_OF_DOMAIN if code is None else code


def _is_code(value, size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size


class _AttributeMethods:
    """What the stream asks of every attribute type (see the module docstring); ``size`` is the
    number of codes."""

    if TYPE_CHECKING:  # provided by every attribute model

        @property
        def size(self) -> int: ...

        def labels(self) -> list[str]: ...

    def decoder(self) -> Callable[[Any], int | None]:
        raise NotImplementedError

    def column_decoder(self) -> Callable[[list], Iterable[int]]:
        decode = self.decoder()
        return lambda col: (MISSING if v is None else _or_out(decode(v)) for v in col)

    def code(self, value: str | int) -> int:
        """The code of a configured value (validated by :meth:`in_domain` when the config loads)."""
        return int(value)

    def in_domain(self, value: Any) -> bool:
        return _is_code(value, self.size)

    def is_label(self, text: str) -> bool:
        """Whether ``text`` names a member of the domain (a declared label; any string for hashed)."""
        return text in self.labels()

    def public_labels(self, ids: Iterable[int]) -> dict[str, str]:
        return {}

    def wire_values(self, codes: np.ndarray) -> list:
        return np.asarray(codes).astype(np.int64).tolist()

    def domain_hint(self, csv: bool = False) -> str:
        """What a report may carry for this attribute, for an ``out_of_domain`` dead letter's detail
        (``csv``: what a CSV cell may be, where it differs)."""
        return f"allowed: an integer code in 0..{self.size - 1}"

    def csv_value(self, text: str) -> str | int:
        """A whole number (:data:`CSV_INTEGER` once :data:`CSV_SPACE` is stripped) becomes that
        integer; other text stays a string (and is decoded as such)."""
        number = text.strip(CSV_SPACE)
        return int(number) if _CSV_INTEGER.match(number) else text


class BinaryAttribute(StrictModel, _AttributeMethods):
    type: Literal["binary"]
    description: str = ""
    label: str = Field(
        default="",
        max_length=60,
        description='what 1 means, in analysts\' labels ("poor" -> "poor in all 3 months"); labels only',
    )

    @property
    def size(self) -> int:
        return 2

    def labels(self) -> list[str]:
        return ["0", "1"]

    def decoder(self):
        def decode(v):
            if v is True or v is False:
                return int(v)
            if type(v) is int and 0 <= v <= 1:
                return v
            return _coerced_binary(v)

        return decode

    def column_decoder(self):
        return lambda col: (
            MISSING
            if v is None
            else v
            if type(v) is int and 0 <= v <= 1
            else int(v)
            if type(v) is bool
            else _or_out(_coerced_binary(v))
            for v in col
        )

    def code(self, value):
        return self.labels().index(value) if isinstance(value, str) else int(value)

    def domain_hint(self, csv: bool = False) -> str:
        return 'allowed: 0 or 1 (also true/false, "0"/"1", 0.0/1.0)'


class CategoricalAttribute(StrictModel, _AttributeMethods):
    type: Literal["categorical"]
    values: list[str] = Field(min_length=2)
    description: str = ""

    @field_validator("values")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("values must be distinct")
        return v

    @property
    def size(self) -> int:
        return len(self.values)

    def labels(self) -> list[str]:
        return list(self.values)

    def decoder(self):
        table = {label: i for i, label in enumerate(self.values)}
        size = len(self.values)

        def decode(v):
            if type(v) is str:
                return table.get(v)
            if type(v) is int and 0 <= v < size:
                return v
            return _integral_float(v, size)

        return decode

    def column_decoder(self):
        table = {label: i for i, label in enumerate(self.values)}
        size = len(self.values)
        return lambda col: (
            MISSING
            if v is None
            else table.get(v, OUT_OF_DOMAIN)
            if type(v) is str
            else v
            if type(v) is int and 0 <= v < size
            else _or_out(_integral_float(v, size))
            for v in col
        )

    def code(self, value):
        return self.values.index(value) if isinstance(value, str) else int(value)

    def in_domain(self, value) -> bool:
        return (isinstance(value, str) and value in self.values) or _is_code(value, self.size)

    def public_labels(self, ids):
        return {str(i): self.values[int(i)] for i in ids}

    def domain_hint(self, csv: bool = False) -> str:
        """The declared labels (the first ``HINT_LABELS`` of a long list), matched case-sensitively;
        a code too, except in a CSV, whose cells are labels (:meth:`csv_value`)."""
        shown = ", ".join(repr(v) for v in self.values[:HINT_LABELS])
        more = (
            f", … ({len(self.values):,} labels in all: see the configuration)"
            if self.size > HINT_LABELS
            else ""
        )
        codes = (
            " (in a CSV a cell is a label, a number too: codes are for JSONL and Parquet)"
            if csv
            else f", or a code in 0..{self.size - 1}"
        )
        return (
            f"allowed: {shown}{more}{codes}; labels match exactly (case-sensitive, no surrounding "
            "spaces)"
        )

    def wire_values(self, codes):
        return np.asarray(self.values, dtype=object)[np.asarray(codes)].tolist()

    def csv_value(self, text):
        """Categorical cells stay strings: a label (a numeric string is a label here, not a code)."""
        return text


class HashedAttribute(StrictModel, _AttributeMethods):
    """An open domain (e.g. free text) mapped through a public hash to ids in [0, size).

    An alert names a value only through the public ``dictionary`` (id -> label), never by
    looking the id up in the private reports.
    """

    type: Literal["hashed"]
    size: int = Field(ge=2, le=2**32)
    dictionary: dict[int, str] = Field(default_factory=dict)
    description: str = ""

    @field_validator("dictionary")
    @classmethod
    def _dictionary_ids(cls, v: dict[int, str], info: ValidationInfo) -> dict[int, str]:
        size = info.data.get("size")
        bad = sorted(i for i in v if size is not None and not 0 <= i < size)
        if bad:
            raise ValueError(
                f"ids {bad[:5]} are outside [0, size={size}): no report can map to them"
            )
        return v

    def decoder(self):
        size = int(self.size)

        def decode(v):
            if type(v) is str:
                return public_hash(v, size)
            if type(v) is int and 0 <= v < size:
                return v
            return _integral_float(v, size)

        return decode

    def column_decoder(self):
        size = int(self.size)
        return lambda col: (
            MISSING
            if v is None
            else public_hash(v, size)
            if type(v) is str
            else v
            if type(v) is int and 0 <= v < size
            else _or_out(_integral_float(v, size))
            for v in col
        )

    def code(self, value):
        return public_hash(value, self.size) if isinstance(value, str) else int(value)

    def in_domain(self, value) -> bool:
        return isinstance(value, str) or _is_code(value, self.size)

    def is_label(self, text: str) -> bool:
        return True  # every string hashes into the domain

    def public_labels(self, ids):
        return {str(i): self.dictionary[int(i)] for i in ids if int(i) in self.dictionary}

    def domain_hint(self, csv: bool = False) -> str:
        return f"allowed: any string (hashed to an id) or an integer id in 0..{self.size - 1}"


Attribute = Annotated[
    BinaryAttribute | CategoricalAttribute | HashedAttribute, Field(discriminator="type")
]
