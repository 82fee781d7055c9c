"""Label schemas and the mappings between them, as data tables.

Three vocabularies meet in clinical de-identification:

* the HIPAA-style categories (``NAME``, ``DATE`` ...), which dphub models predict by default;
* the i2b2-2014 subcategories (``PATIENT``, ``DOCTOR``, ``HOSPITAL`` ...);
* the PhysioNet deid types (``PTName``, ``HCPName``, ``DateYear`` ...).

Every known label maps to exactly one category (``CATEGORY_OF``) and, where it is not itself a
subcategory, to a canonical i2b2-style subcategory (``FINE_OF``). Lookups are case-insensitive.
Adding a vocabulary is adding rows here, never a code branch elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from dphub.errors import LabelError

CATEGORIES: tuple[str, ...] = (
    "NAME",
    "DATE",
    "AGE",
    "CONTACT",
    "ID",
    "LOCATION",
    "PROFESSION",
    "OTHER",
)

#: i2b2-2014 subcategory -> category (plus RELATIVE, which the PhysioNet corpus distinguishes).
I2B2_SUBCATEGORIES: dict[str, str] = {
    "PATIENT": "NAME",
    "DOCTOR": "NAME",
    "USERNAME": "NAME",
    "RELATIVE": "NAME",
    "PROFESSION": "PROFESSION",
    "ROOM": "LOCATION",
    "DEPARTMENT": "LOCATION",
    "HOSPITAL": "LOCATION",
    "ORGANIZATION": "LOCATION",
    "STREET": "LOCATION",
    "CITY": "LOCATION",
    "STATE": "LOCATION",
    "COUNTRY": "LOCATION",
    "ZIP": "LOCATION",
    "LOCATION-OTHER": "LOCATION",
    "AGE": "AGE",
    "DATE": "DATE",
    "PHONE": "CONTACT",
    "FAX": "CONTACT",
    "EMAIL": "CONTACT",
    "URL": "CONTACT",
    "IPADDR": "CONTACT",
    "SSN": "ID",
    "MEDICALRECORD": "ID",
    "HEALTHPLAN": "ID",
    "ACCOUNT": "ID",
    "LICENSE": "ID",
    "VEHICLE": "ID",
    "DEVICE": "ID",
    "BIOID": "ID",
    "IDNUM": "ID",
    "OTHER": "OTHER",
}

#: PhysioNet deid 1.1 PHI types -> i2b2-style subcategory.
PHYSIONET_TYPES: dict[str, str] = {
    "HCPName": "DOCTOR",
    "PTName": "PATIENT",
    "PTNameInitial": "PATIENT",
    "RelativeProxyName": "RELATIVE",
    "Date": "DATE",
    "DateYear": "DATE",
    "Location": "LOCATION-OTHER",
    "Phone": "PHONE",
    "Age": "AGE",
    "Other": "OTHER",
}

#: Category names used as labels map to a representative subcategory (for surrogates).
CATEGORY_DEFAULT_FINE: dict[str, str] = {
    "NAME": "PATIENT",
    "DATE": "DATE",
    "AGE": "AGE",
    "CONTACT": "PHONE",
    "ID": "IDNUM",
    "LOCATION": "LOCATION-OTHER",
    "PROFESSION": "PROFESSION",
    "OTHER": "OTHER",
}

#: Precedence when two labels tie (ensemble merge): earlier wins. Names leak most.
CATEGORY_PRECEDENCE: tuple[str, ...] = (
    "NAME",
    "ID",
    "CONTACT",
    "DATE",
    "AGE",
    "LOCATION",
    "PROFESSION",
    "OTHER",
)


def _build_tables() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    category: dict[str, str] = {}
    fine: dict[str, str] = {}
    canonical: dict[str, str] = {}
    for c in CATEGORIES:
        category[c.upper()] = c
        fine[c.upper()] = CATEGORY_DEFAULT_FINE[c]
        canonical[c.upper()] = c
    for sub, c in I2B2_SUBCATEGORIES.items():
        # a subcategory spelled like its category (AGE, DATE ...) keeps the category's row
        category.setdefault(sub.upper(), c)
        fine[sub.upper()] = sub
        canonical.setdefault(sub.upper(), sub)
    for typ, sub in PHYSIONET_TYPES.items():
        category[typ.upper()] = I2B2_SUBCATEGORIES[sub]
        fine[typ.upper()] = sub
        # a PhysioNet type spelled like a category/subcategory (Date, Age, Phone, Location)
        # keeps the i2b2 spelling
        canonical.setdefault(typ.upper(), typ)
    return category, fine, canonical


CATEGORY_OF, FINE_OF, CANONICAL = _build_tables()

#: The label of a word the inverse rule hides that no member typed (:mod:`dphub.ensemble.inverse`).
#: A category of its own but not one of :data:`CATEGORIES` (no model predicts it, no schema or
#: rule feature changes): tag mode writes ``[**PHI**]``, surrogate mode masks it (no fake value).
UNTYPED = "PHI"
CATEGORY_OF[UNTYPED] = FINE_OF[UNTYPED] = CANONICAL[UNTYPED] = UNTYPED


def category_of(label: str, *, where: str | None = None) -> str:
    """Return the HIPAA category of any known label; raise :class:`LabelError` otherwise."""
    try:
        return CATEGORY_OF[label.upper()]
    except (KeyError, AttributeError):
        prefix = f"{where}: " if where else ""
        raise LabelError(
            f"{prefix}unknown PHI label {label!r}; known: categories {', '.join(CATEGORIES)}, "
            "i2b2-2014 subcategories and PhysioNet types (see `dphub.labels`)"
        ) from None


def fine_of(label: str) -> str:
    """Return the i2b2-style subcategory for any known label (category names map to a default)."""
    category_of(label)
    return FINE_OF[label.upper()]


def canonical_label(label: str) -> str:
    """The label's canonical spelling (``location`` -> ``Location``, ``phone`` -> ``PHONE``)."""
    category_of(label)
    return CANONICAL[label.upper()]


def is_known(label: str) -> bool:
    return isinstance(label, str) and label.upper() in CATEGORY_OF


@dataclass(frozen=True)
class LabelSchema:
    """The label set a model predicts, and how any known label maps into it."""

    name: str
    labels: tuple[str, ...]
    #: how an input label is mapped onto this schema's labels
    granularity: str  # "category" | "fine"

    def map(self, label: str) -> str:
        """Map any known label onto this schema (e.g. ``HCPName`` -> ``NAME`` for ``hipaa``)."""
        if self.granularity == "category":
            return category_of(label)
        f = fine_of(label)
        if f not in self.labels:
            raise LabelError(f"label {label!r} has no counterpart in schema {self.name!r}")
        return f

    def bioes_tags(self) -> list[str]:
        """``O`` followed by B-/I-/E-/S- tags of every label, in a fixed order."""
        tags = ["O"]
        for lab in self.labels:
            tags.extend(f"{p}-{lab}" for p in "BIES")
        return tags


SCHEMAS: dict[str, LabelSchema] = {
    "hipaa": LabelSchema("hipaa", CATEGORIES, "category"),
    "i2b2-2014": LabelSchema("i2b2-2014", tuple(I2B2_SUBCATEGORIES), "fine"),
}


def get_schema(name: str) -> LabelSchema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise LabelError(
            f"unknown label schema {name!r}; available: {', '.join(sorted(SCHEMAS))}"
        ) from None
